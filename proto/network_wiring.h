// The wiring of a network's layers: whose outputs each layer takes. A pure
// function of the spec: ValidateJobSpec checks it (so a job that cannot be
// wired is refused at submission, at its line in job.yaml) and the
// trainer's Network::Build follows it.
#ifndef DLBATCH_PROTO_NETWORK_WIRING_H_
#define DLBATCH_PROTO_NETWORK_WIRING_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dlbatch/v1/job.pb.h"

namespace dlbatch {

// What `inputs` call the network's own input.
inline constexpr char kNetworkInputName[] = "input";

struct NetworkWiring {
  // Per layer: its name (spec's, else "<type>_<index+1>").
  std::vector<std::string> names;
  // Per layer: the layers whose outputs it takes, in the spec's order;
  // -1 is the network's input. A layer without `inputs` takes the previous
  // layer's output (the network's input for the first).
  std::vector<std::vector<int>> inputs;
  // Per layer: the layers that take its output, lowest index first.
  std::vector<std::vector<int>> consumers;
};

// Resolves `inputs` by name. InvalidArgument, naming the layers
// ("layers[3] (add 'sum'): ..."), for: two
// layers of one name (or one named "input"); an input that names no layer;
// inputs that form a cycle; an input listed after the layer that takes it;
// an output nobody takes (other than the last layer's).
absl::StatusOr<NetworkWiring> WireNetwork(const v1::NetworkSpec& spec);

// How messages name layer i of `spec`: "layers[3] (conv 'res_a')".
// REQUIRES: `w` has a name for layer i (WireNetwork's, or one being made).
std::string DescribeLayer(const v1::NetworkSpec& spec, const NetworkWiring& w,
                          int i);

}  // namespace dlbatch

#endif  // DLBATCH_PROTO_NETWORK_WIRING_H_
