#include "proto/network_wiring.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dlbatch {
namespace {

absl::Status Refuse(const v1::NetworkSpec& spec, const NetworkWiring& w, int i,
                    const std::string& message) {
  return absl::InvalidArgumentError(
      absl::StrCat(DescribeLayer(spec, w, i), ": ", message));
}

// A path of input edges from `from` back to `to` (both included), or empty:
// the layers of a cycle when `to` takes `from` as input.
std::vector<int> PathBack(const std::vector<std::vector<int>>& inputs, int from,
                          int to) {
  std::vector<int> path;
  std::vector<bool> seen(inputs.size(), false);
  auto visit = [&](auto&& self, int at) -> bool {
    if (at < 0 || seen[at]) return false;
    seen[at] = true;
    path.push_back(at);
    if (at == to) return true;
    for (int next : inputs[at]) {
      if (self(self, next)) return true;
    }
    path.pop_back();
    return false;
  };
  visit(visit, from);
  return path;
}

}  // namespace

std::string DescribeLayer(const v1::NetworkSpec& spec, const NetworkWiring& w,
                          int i) {
  return absl::StrCat("layers[", i, "] (", spec.layers(i).type(), " '",
                      w.names[i], "')");
}

absl::StatusOr<NetworkWiring> WireNetwork(const v1::NetworkSpec& spec) {
  const int count = spec.layers_size();
  NetworkWiring w;
  absl::flat_hash_map<std::string, int> by_name;
  for (int i = 0; i < count; ++i) {
    const v1::LayerSpec& layer = spec.layers(i);
    w.names.push_back(layer.name().empty()
                          ? absl::StrCat(layer.type(), "_", i + 1)
                          : layer.name());
    if (w.names[i] == kNetworkInputName) {
      return Refuse(spec, w, i,
                    absl::StrCat("the name '", kNetworkInputName,
                                 "' stands for the network's input in "
                                 "inputs; give the layer another name"));
    }
    auto [it, added] = by_name.emplace(w.names[i], i);
    if (!added) {
      return Refuse(spec, w, i,
                    absl::StrCat("the name '", w.names[i], "' is taken by ",
                                 DescribeLayer(spec, w, it->second),
                                 "; give each layer its own name"));
    }
  }

  // Resolve every name first, so that a cycle can be told from an input
  // merely listed too late.
  w.inputs.resize(count);
  for (int i = 0; i < count; ++i) {
    const v1::LayerSpec& layer = spec.layers(i);
    if (layer.inputs_size() == 0) {
      w.inputs[i].push_back(i - 1);
      continue;
    }
    for (const std::string& name : layer.inputs()) {
      if (name == kNetworkInputName) {
        w.inputs[i].push_back(-1);
        continue;
      }
      auto it = by_name.find(name);
      if (it == by_name.end()) {
        std::vector<std::string> known = {kNetworkInputName};
        for (int j = 0; j < i; ++j) known.push_back(w.names[j]);
        return Refuse(
            spec, w, i,
            absl::StrCat("input '", name, "' is the name of no layer; ",
                         "the layers before this one are: ",
                         absl::StrJoin(known, ", ")));
      }
      w.inputs[i].push_back(it->second);
    }
  }
  for (int i = 0; i < count; ++i) {
    for (int j : w.inputs[i]) {
      if (j < i) continue;
      std::vector<int> cycle = PathBack(w.inputs, j, i);
      if (!cycle.empty()) {
        // cycle runs j -> ... -> i against the data's flow; print it along.
        std::vector<std::string> names = {w.names[i]};
        for (int k : cycle) names.push_back(w.names[k]);
        std::reverse(names.begin(), names.end());
        return Refuse(spec, w, i,
                      absl::StrCat("its inputs form a cycle (",
                                   absl::StrJoin(names, " -> "),
                                   "); a network's outputs must flow one way"));
      }
      return Refuse(
          spec, w, i,
          absl::StrCat("takes the output of ", DescribeLayer(spec, w, j),
                       ", which is listed after it; list each layer "
                       "after the layers it takes as input"));
    }
  }

  // (The network's input is always taken: the first layer can take
  // nothing else.)
  w.consumers.resize(count);
  for (int i = 0; i < count; ++i) {
    for (int j : w.inputs[i]) {
      if (j >= 0 && (w.consumers[j].empty() || w.consumers[j].back() != i)) {
        w.consumers[j].push_back(i);
      }
    }
  }
  for (int i = 0; i + 1 < count; ++i) {
    if (w.consumers[i].empty()) {
      return Refuse(
          spec, w, i,
          absl::StrCat("its output is used by no layer (only the last "
                       "layer's output may be); take it as an input of a "
                       "later layer (an add or concat joins outputs) or "
                       "remove it"));
    }
  }
  return w;
}

}  // namespace dlbatch
