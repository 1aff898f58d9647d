// loom's dtypes, reductions and NCCL's results in NCCL's terms.
#pragma once

#include <loom/sdk.h>
#include <nccl.h>

#include <string>

namespace loom::comm_nccl {

/// NCCL's type for a reducible dtype (loom/cpp/comm_checks.h `comm_reducible`); throws
/// Error(kInternal) for others, which the checks have refused before.
ncclDataType_t nccl_type(DType dtype);

/// NCCL's reduction for `op` (avg is NCCL's own ncclAvg: sum, then divide by the group
/// size, in the dtype).
ncclRedOp_t nccl_op(ReduceOp op);

/// "unhandled system error (ncclSystemError); NCCL: <ncclGetLastError text>"; the last
/// error is left out when NCCL has none.
std::string nccl_error_text(ncclResult_t result);

/// The status code of a failed NCCL call: kAborted for a remote or system error (a peer or
/// the network failed), kInternal otherwise (a CUDA error, or a misuse that means the ranks
/// are out of step).
Code code_of(ncclResult_t result);

}  // namespace loom::comm_nccl
