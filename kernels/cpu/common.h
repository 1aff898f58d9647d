// Shared internals of the CPU kernels: element loads and stores in every float dtype, the
// argument checks that turn a bad call into a Status naming the op and the problem, and
// the helpers that build KernelDescs.
//
// Every op file follows one pattern:
//   Shape check_OP(const OpCall*, bool shapes_only);  // throws loom::Error naming the op
//   Status OP_ref(const OpCall*);     // plain loops, one element at a time: the oracle
//   Status OP_fast(const OpCall*);    // OpenMP + AVX2 (or OpenBLAS), tested against _ref
// Reference code is compiled for the baseline x86-64 ISA; fast code sits between
// LOOM_CPU_FAST_BEGIN / LOOM_CPU_FAST_END and is compiled for AVX2+FMA+F16C, and the
// fast kernels' `supports` return false on a CPU without them, so find_kernel falls back
// to the reference instead of dying of SIGILL.
#pragma once

#include <loom/cpp/error.h>
#include <loom/cpp/half.h>
#include <loom/cpp/kernel_descs.h>
#include <loom/cpp/op_args.h>
#include <loom/kernel.h>
#include <loom/ops.h>
#include <stdint.h>

#include <cmath>
#include <initializer_list>
#include <string>
#include <vector>

#define LOOM_CPU_FAST_BEGIN _Pragma("GCC push_options") _Pragma("GCC target(\"avx2,fma,f16c\")")
#define LOOM_CPU_FAST_END _Pragma("GCC pop_options")

namespace loom::kernels::cpu {

inline constexpr int32_t kRefPriority = 0;
inline constexpr int32_t kFastPriority = 10;
inline constexpr const char* kRefName = "cpu.ref";
inline constexpr const char* kFastName = "cpu.fast";

inline bool is_float(DType t) { return is_float_dtype(t); }

// ---- Element access (the reference path converts one element at a time) -----------------

inline float load(const void* data, DType t, int64_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(data)[i];
    case DType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
    default:
      return 0.0f;  // unreachable: the checks admit float dtypes only
  }
}

inline void store(void* data, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kF32:
      static_cast<float*>(data)[i] = v;
      break;
    case DType::kBF16:
      static_cast<uint16_t*>(data)[i] = f32_to_bf16(v);
      break;
    case DType::kF16:
      static_cast<uint16_t*>(data)[i] = f32_to_f16(v);
      break;
    default:
      break;
  }
}

inline float load(const TensorView& v, int64_t i) { return load(v.data, v.dtype, i); }
inline void store(const TensorView& v, int64_t i, float x) { store(v.data, v.dtype, i, x); }
inline const float* f32(const TensorView& v) { return static_cast<const float*>(v.data); }
inline float* f32_mut(const TensorView& v) { return static_cast<float*>(v.data); }
inline const int32_t* i32(const TensorView& v) { return static_cast<const int32_t*>(v.data); }

// Fast path: converts n elements of `data` (dtype t) from element i on into / out of f32
// (AVX2 + F16C; bf16 stores round to nearest even like f32_to_bf16). Defined in common.cc.
void load_row(const void* data, DType t, int64_t i, int64_t n, float* out);
void store_row(void* data, DType t, int64_t i, int64_t n, const float* in);

// A whole tensor as packed f32: the tensor's own memory when it is packed f32, else a
// converted copy (converted in parallel). Used where a fast kernel reads an operand many
// times. `v` may be a view with strided rows whose last dimension is packed
// (OpArgs::float_rows_in): those are gathered.
class F32Copy {
 public:
  explicit F32Copy(const TensorView& v);
  const float* data() const { return ptr_; }

 private:
  std::vector<float> copy_;
  const float* ptr_;
};

// True when this CPU runs the fast kernels' instruction set (AVX2, FMA, F16C).
bool cpu_has_avx2();

// ---- Argument checks ------------------------------------------------------------------

// "(3, 4)"
inline std::string shape_str(const TensorView& v) { return view_shape_str(v); }

// The checks of one call (loom/cpp/op_args.h) for the CPU kernels: tensors must be in host
// memory. Every failure throws loom::Error(kInvalidArgument) whose message starts with the
// op's name.
class Args : public OpArgs {
 public:
  Args(const OpCall* call, const char* op, std::initializer_list<const char*> inputs,
       std::initializer_list<const char*> outputs, bool shapes_only)
      : OpArgs(call, op, inputs, outputs, shapes_only, DeviceType::kCpu) {}
};

// Runs `check` and reports whether it passed (for `supports`: never throws).
template <class F>
bool passes(F&& check) noexcept {
  return check_passes(static_cast<F&&>(check));
}

// The attention mask of loom/ops.h: key s is hidden from query t (of T queries and S keys)
// when causal and s > t + (S - T), or when their segment ids differ (`seg`: the batch
// row's query ids (T) or null, `key_seg`: its key ids (S), `seg` itself when T == S and the
// call has no key ids).
inline bool attention_masked(bool causal, int64_t t, int64_t s, int64_t T, int64_t S,
                             const int32_t* seg, const int32_t* key_seg) {
  if (causal && s > t + (S - T)) return true;
  return seg != nullptr && seg[t] != key_seg[s];
}

// ---- Composed kernels -----------------------------------------------------------------

// Runs `op` for `key` through this library's kernel: the fast one when `fast` and the
// library has it, else the reference. For kernels defined as a sequence of other ops
// (gemm_epilogue, add_layernorm_*), so that "cpu.ref" runs reference steps and "cpu.fast"
// the fast ones, as a module resolving the unfused ops would get them. Throws on failure.
void run_library_op(const char* op, DType key, bool fast, std::initializer_list<TensorView> inputs,
                    std::initializer_list<TensorView> outputs, const void* attrs,
                    uint64_t attrs_size);
template <class Attrs>
void run_library_op(const char* op, DType key, bool fast, std::initializer_list<TensorView> inputs,
                    std::initializer_list<TensorView> outputs, const Attrs* attrs) {
  run_library_op(op, key, fast, inputs, outputs, attrs, attrs ? sizeof(Attrs) : 0);
}

// ---- Cost helpers ---------------------------------------------------------------------

// io_cost (bytes of every present input and output; flops as given) is loom::io_cost in
// loom/cpp/kernel_descs.h.
// Largest element count among the call's tensors (the "n" of an elementwise op).
int64_t max_numel(const OpCall* call);

// Defines NAME_supports (the reference's: the checks pass) and NAME_fast_supports (also
// needs AVX2) for an op whose checks are `CHECK(const OpCall*, bool shapes_only)`.
#define LOOM_CPU_SUPPORTS(NAME, CHECK)                          \
  [[maybe_unused]] bool NAME##_supports(const OpCall* c) {      \
    return passes([&] { CHECK(c, true); });                     \
  }                                                             \
  [[maybe_unused]] bool NAME##_fast_supports(const OpCall* c) { \
    return cpu_has_avx2() && NAME##_supports(c);                \
  }

// LOOM_CPU_SUPPORTS, and NAME_cost (FLOPS_PER_ELEM * max_numel, bytes of every tensor).
#define LOOM_CPU_HOOKS(NAME, CHECK, FLOPS_PER_ELEM)                            \
  LOOM_CPU_SUPPORTS(NAME, CHECK)                                               \
  [[maybe_unused]] Status NAME##_cost(const OpCall* c, OpCost* out) {          \
    return guard([&] {                                                         \
      CHECK(c, true);                                                          \
      *out = io_cost(c, (FLOPS_PER_ELEM) * static_cast<double>(max_numel(c))); \
    });                                                                        \
  }

// Registers NAME_ref and NAME_fast (with the hooks above) for OP in every float dtype.
#define LOOM_CPU_REGISTER(OUT, OP, NAME)                                                    \
  do {                                                                                      \
    add_kernels(OUT, OP, kRefName, kRefPriority, NAME##_ref, NAME##_supports, NAME##_cost); \
    add_kernels(OUT, OP, kFastName, kFastPriority, NAME##_fast, NAME##_fast_supports,       \
                NAME##_cost);                                                               \
  } while (0)

// ---- Kernel registration ---------------------------------------------------------------

inline constexpr DType kFloatTypes[] = {DType::kF32, DType::kBF16, DType::kF16};

// Appends one KernelDesc per dtype of `dtypes` (by default every float dtype).
void add_kernels(std::vector<KernelDesc>& out, const char* op, const char* name, int32_t priority,
                 KernelFn fn, KernelSupportsFn supports, KernelCostFn cost,
                 std::initializer_list<DType> dtypes = {DType::kF32, DType::kBF16, DType::kF16});

// Each op family appends its reference and fast kernels.
void add_gemm_kernels(std::vector<KernelDesc>& out);
void add_gemm_epilogue_kernels(std::vector<KernelDesc>& out);
void add_elementwise_kernels(std::vector<KernelDesc>& out);
void add_activation_kernels(std::vector<KernelDesc>& out);
void add_dropout_kernels(std::vector<KernelDesc>& out);
void add_embedding_kernels(std::vector<KernelDesc>& out);
void add_layernorm_kernels(std::vector<KernelDesc>& out);
void add_rmsnorm_kernels(std::vector<KernelDesc>& out);
void add_add_norm_kernels(std::vector<KernelDesc>& out);
void add_rope_kernels(std::vector<KernelDesc>& out);
void add_qkv_kernels(std::vector<KernelDesc>& out);
void add_softmax_kernels(std::vector<KernelDesc>& out);
void add_attention_kernels(std::vector<KernelDesc>& out);
void add_flash_attention_kernels(std::vector<KernelDesc>& out);
void add_cross_entropy_kernels(std::vector<KernelDesc>& out);
void add_cross_entropy_shard_kernels(std::vector<KernelDesc>& out);
void add_optim_kernels(std::vector<KernelDesc>& out);
void add_fp8_kernels(std::vector<KernelDesc>& out);
void add_swiglu_fp8_kernels(std::vector<KernelDesc>& out);
void add_rope_fp8_kernels(std::vector<KernelDesc>& out);
void add_moe_topk_kernels(std::vector<KernelDesc>& out);
void add_moe_permute_kernels(std::vector<KernelDesc>& out);
void add_grouped_gemm_kernels(std::vector<KernelDesc>& out);
void add_causal_conv1d_kernels(std::vector<KernelDesc>& out);
void add_ssd_scan_kernels(std::vector<KernelDesc>& out);
void add_rmsnorm_gated_kernels(std::vector<KernelDesc>& out);
void add_mla_kernels(std::vector<KernelDesc>& out);

}  // namespace loom::kernels::cpu
