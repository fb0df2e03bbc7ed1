#include "trainer/backend.h"

#include <utility>

namespace dlbatch::trainer {

Buffer::~Buffer() {
  if (data_ != nullptr) backend_->Free(data_);
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) backend_->Free(data_);
    backend_ = std::exchange(other.backend_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

}  // namespace dlbatch::trainer
