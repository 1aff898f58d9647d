#include "plugins/comm_nccl/nccl_types.h"

namespace loom::comm_nccl {
namespace {

const char* result_name(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "ncclSuccess";
    case ncclUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case ncclSystemError:
      return "ncclSystemError";
    case ncclInternalError:
      return "ncclInternalError";
    case ncclInvalidArgument:
      return "ncclInvalidArgument";
    case ncclInvalidUsage:
      return "ncclInvalidUsage";
    case ncclRemoteError:
      return "ncclRemoteError";
    case ncclInProgress:
      return "ncclInProgress";
    default:
      return "unknown ncclResult_t";
  }
}

}  // namespace

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF64:
      return ncclFloat64;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclFloat16;
    case DType::kI32:
      return ncclInt32;
    case DType::kI64:
      return ncclInt64;
    case DType::kU8:
      return ncclUint8;
    default:
      LOOM_CHECK(false, "no NCCL reduction type for dtype ", dtype_name(dtype));
  }
  return ncclUint8;  // unreachable
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  LOOM_CHECK(false, "unknown reduce op ", static_cast<int32_t>(op));
  return ncclSum;  // unreachable
}

std::string nccl_error_text(ncclResult_t result) {
  const char* text = ncclGetErrorString(result);
  std::string out =
      std::string(text != nullptr ? text : "unknown error") + " (" + result_name(result) + ")";
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && last[0] != '\0') out += "; NCCL: " + std::string(last);
  return out;
}

Code code_of(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return Code::kOk;
    case ncclRemoteError:
    case ncclSystemError:
      return Code::kAborted;
    default:
      return Code::kInternal;
  }
}

}  // namespace loom::comm_nccl
