// TestModule<I>: IModule bookkeeping for the test plugins' modules (no parameters, no
// children, forward/backward unimplemented), so each test plugin writes only what it tests.
#pragma once

#include <loom/sdk.h>

namespace loom::testing {

template <class I>
class TestModule : public Object<I> {
 public:
  int32_t param_count() const noexcept override { return 0; }
  Status param_info(int32_t, ParamInfo*) const noexcept override {
    return make_status(Code::kOutOfRange, "no parameters");
  }
  Status bind_param(int32_t, const TensorView*, const TensorView*) noexcept override {
    return make_status(Code::kOutOfRange, "no parameters");
  }
  Status init_param(int32_t, uint64_t) noexcept override { return ok_status(); }
  int32_t child_count() const noexcept override { return 0; }
  Status child(int32_t, StringView*, IModule**) noexcept override {
    return make_status(Code::kOutOfRange, "no children");
  }
  Status forward(IForwardContext*, const TensorView*, int32_t, TensorView*,
                 int32_t) noexcept override {
    return make_status(Code::kUnimplemented, "test module");
  }
  Status backward(IForwardContext*, const TensorView*, int32_t, TensorView*,
                  int32_t) noexcept override {
    return make_status(Code::kUnimplemented, "test module");
  }
  Status backward_weight(IForwardContext*) noexcept override { return ok_status(); }
  Status step_end(const StepEvent*) noexcept override { return ok_status(); }
};

}  // namespace loom::testing
