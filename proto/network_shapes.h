// The shapes of a network's layers, from its spec alone: no weights, no
// backend, no data (the spec's `input:` gives the first shape). A pure
// function of the spec, as the wiring is (network_wiring.h):
// ValidateJobSpec checks it, so that a network whose layers do not fit its
// input is refused at submission, at the layer's line in job.yaml, and the
// trainer's Network::Build makes its layers to these shapes, so that both
// say the same thing of a network that does not fit.
#ifndef DLBATCH_PROTO_NETWORK_SHAPES_H_
#define DLBATCH_PROTO_NETWORK_SHAPES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "dlbatch/v1/job.pb.h"
#include "proto/network_wiring.h"
#include "proto/sample_shape.h"

namespace dlbatch {

// `same` padding of one dimension: the output covers ceil(in / stride)
// positions; the extra row or column goes at the bottom or right.
// REQUIRES: in >= 1, k >= 1, stride >= 1.
void SamePadding(int in, int k, int stride, int* before, int* after, int* out);

// The shape `layer` makes of `ins`, its inputs' shapes in the order of its
// `inputs` (`in_names` names them in messages; one name per shape).
// InvalidArgument, saying what to change, for: an unknown type; a count of
// inputs the type does not take (add and concat join two or more, every
// other layer takes one); conv filters or fc units not > 0; a window's size
// not > 0, a negative stride or padding, or both padding and `same`; a
// window larger than its padded input; add's inputs of different shapes,
// concat's of different height or width; softmax's input other than
// [1, 1, classes]. The messages name no layer: the caller does.
absl::StatusOr<LayerShape> InferLayerShape(
    const v1::LayerSpec& layer, absl::Span<const SampleShape> ins,
    absl::Span<const std::string> in_names);

// Every layer's shape, in the spec's order, its inputs taken as `wiring`
// (WireNetwork of the same spec) says. Refuses, besides InferLayerShape's
// faults, an input that is not three numbers > 0, a network without
// layers, one whose last layer is not softmax and a softmax before the
// last layer. Messages begin "layers[i] (type 'name'): ", as WireNetwork's
// do (those about the whole network: "input: " or "layers: ").
absl::StatusOr<std::vector<LayerShape>> InferNetworkShapes(
    const v1::NetworkSpec& spec, const NetworkWiring& wiring);

}  // namespace dlbatch

#endif  // DLBATCH_PROTO_NETWORK_SHAPES_H_
