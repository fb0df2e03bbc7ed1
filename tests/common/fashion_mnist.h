// Where tests find Fashion-MNIST's four IDX files.
#ifndef DLBATCH_TESTS_COMMON_FASHION_MNIST_H_
#define DLBATCH_TESTS_COMMON_FASHION_MNIST_H_

#include <cstdlib>
#include <string>

namespace dlbatch::testing {

// DLBATCH_TEST_DATA_DIR, else Debian's dataset-fashion-mnist
// (/usr/share/datasets/fashion-mnist).
inline std::string FashionMnistDir() {
  const char* env = std::getenv("DLBATCH_TEST_DATA_DIR");
  return env != nullptr && *env != '\0' ? env
                                        : "/usr/share/datasets/fashion-mnist";
}

}  // namespace dlbatch::testing

#endif  // DLBATCH_TESTS_COMMON_FASHION_MNIST_H_
