#pragma once
// The chunked transfer with its staging chunk on a chosen device (internal to dra::dra): the NCCL
// transfer packs small pieces into a device chunk; Gloo's (make_chunked_transfer) into a CPU one.
#include <c10/core/Device.h>

#include <cstddef>
#include <memory>

#include "dra/torch/comm/communicator.hpp"

namespace dra::comm {

/// make_chunked_transfer with the staging chunk on `staging`; tensors may live on the CPU or on
/// `staging` (the communicator moves CPU pieces to its device where it must).
std::unique_ptr<tensor_transfer> make_chunked_transfer_on(std::size_t chunk_bytes, at::Device staging);

}  // namespace dra::comm
