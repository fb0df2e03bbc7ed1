// Export of a trained network as an ONNX model (opset 13), NCHW as ONNX
// requires: input "images" of shape [batch, C, H, W] with pixels scaled to
// [0, 1] (the data set's per-channel normalisation, when the job asked for
// it, is the model's first nodes), output "probabilities" [batch, classes].
// Weights are stored as initializers, transposed from the trainer's
// channels-last layout (network.h) to ONNX's OIHW, and fc weights that
// follow a spatial input are permuted to NCHW flatten order.
#ifndef DLBATCH_TRAINER_OUTPUT_ONNX_EXPORT_H_
#define DLBATCH_TRAINER_OUTPUT_ONNX_EXPORT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/data/data.h"
#include "trainer/network.h"

namespace dlbatch::trainer {

// What is exported: the network's description and host copies of its
// parameter and state buffers (layouts of network.h).
struct ModelForExport {
  std::string name;
  Shape input;
  int num_classes = 0;
  std::vector<LayerInfo> layers;
  std::vector<ParamInfo> params_info;
  std::vector<ParamInfo> state_info;
  std::vector<float> params;
  std::vector<float> state;
  Normalization normalization;  // empty: none
  // Label i's name (format folders); empty: none. Written as the model's
  // metadata "class_names", a JSON list.
  std::vector<std::string> class_names;
};

// The serialized ModelProto. Dropout exports as identity; batchnorm with
// its running statistics (inference form).
absl::StatusOr<std::string> ExportOnnx(const ModelForExport& model);

}  // namespace dlbatch::trainer

#endif  // DLBATCH_TRAINER_OUTPUT_ONNX_EXPORT_H_
