// The interface kinds that plugins implement, each with the (major, minor) version these
// headers describe. A spec node's `"impl"` names a factory registered for one of them.
//
// New kinds are appended; an existing kind changes its major only with the ABI major. Its
// minor grows when a method is appended to its interface: a plugin handed an object by the
// core (a forward context, a communicator) checks interface_info() before calling a method
// newer than x.0, since an older core's object lacks it.
#pragma once

#include "loom/types.h"

namespace loom::kinds {

// Modules (loom/kinds/module.h and the headers beside it). 1.1 (ABI 1.5): IModule appends
// backward_weight and step_end, so every module kind has them; the model kind also appends
// info and cost. norm 1.2 (ABI 1.9): a calling convention, no new method: a residual input
// fused into the norm and a second gradient added into the input's (loom/kinds/model.h,
// INorm); a caller checks the minor before passing them. attention 1.2 (ABI 1.10): a calling
// convention too: q, k, v may be the views of one fused QKV tensor (loom/cpp/nn/qkv_views.h,
// loom/kinds/attention.h); a caller checks the minor before passing such views. optimizer 1.3
// (ABI 1.11): OptimizerStep::scalars, the step's values in device memory
// (loom/kinds/optimizer.h); a caller checks the minor (has_step_scalars) before passing them.
// forward_context 1.7 (ABI 1.12): loss_grad, the loss's gradient while the forward runs.
// forward_context 1.8 (ABI 1.17): grad_first_write, the step's first write of a gradient
// (kParamGradOverwrite), which may overwrite it.
// forward_context 1.9 (ABI 1.18): param_version, the id of the parameter values a pass sees
// (what a module derives from them may serve every pass with the same id).
// fp8_recipe 1.1 (ABI 1.13): producer, a quantiser's scale and amax for a kernel that
// quantises its own result.
// fp8_recipe 1.2 (ABI 1.18): state_quantizer_dim, along which a checkpoint concatenates the
// pipeline stages' state tensors, and quantizer_count, which ids each virtual chunk's are.
inline constexpr InterfaceInfo kModel{"model", 1, 1};                   ///< whole network
inline constexpr InterfaceInfo kLayer{"layer", 1, 1};                   ///< one transformer layer
inline constexpr InterfaceInfo kModule{"module", 1, 1};                 ///< any other module
inline constexpr InterfaceInfo kAttention{"attention", 1, 2};           ///< attention core
inline constexpr InterfaceInfo kMlp{"mlp", 1, 1};                       ///< feed-forward block
inline constexpr InterfaceInfo kNorm{"norm", 1, 2};                     ///< LayerNorm, RMSNorm, ...
inline constexpr InterfaceInfo kMixer{"mixer", 1, 1};                   ///< sequence mixer (Mamba)
inline constexpr InterfaceInfo kRouter{"router", 1, 1};                 ///< MoE router
inline constexpr InterfaceInfo kMoeDispatcher{"moe_dispatcher", 1, 0};  ///< MoE token moves
// Numerics and training.
inline constexpr InterfaceInfo kFp8Recipe{"fp8_recipe", 1, 2};
/// 1.1: update_many (check has_update_many before calling it); 1.2: hyper (has_hyper).
inline constexpr InterfaceInfo kOptimizer{"optimizer", 1, 4};
inline constexpr InterfaceInfo kLrSchedule{"lr_schedule", 1, 0};
inline constexpr InterfaceInfo kPipelineSchedule{"pipeline_schedule", 1, 0};
// Infrastructure.
inline constexpr InterfaceInfo kCheckpointFormat{"checkpoint_format", 1, 1};
inline constexpr InterfaceInfo kCommBackend{"comm_backend", 1, 0};
// Not spec-selected kinds, but versioned the same way.
inline constexpr InterfaceInfo kFactory{"factory", 1, 0};
/// 1.1: copy, fill_zero, compute_stream, synchronize (devices other than the CPU);
/// 1.2: group (process groups by role).
inline constexpr InterfaceInfo kHost{"host", 1, 2};
/// 1.1: add_device_runtime.
inline constexpr InterfaceInfo kRegistry{"registry", 1, 1};
/// 1.1: fp8_recipe.
inline constexpr InterfaceInfo kBuildContext{"build_context", 1, 1};
/// 1.1: kv_cache; 1.2: grads_ready; 1.3: release, drop_saved; 1.4: defer_weight_grads,
/// metric; 1.5: aux_loss_weight; 1.6: its kv_cache() has IKvCache::state; 1.7: loss_grad;
/// 1.8: grad_first_write; 1.9: param_version.
inline constexpr InterfaceInfo kForwardContext{"forward_context", 1, 9};
/// 1.1: asynchronous collectives returning ICommWork (check the minor before calling them).
inline constexpr InterfaceInfo kCommunicator{"communicator", 1, 1};
inline constexpr InterfaceInfo kKernel{"kernel", 1, 0};       ///< op kernels, loom/kernel.h
inline constexpr InterfaceInfo kCommWork{"comm_work", 1, 0};  ///< ICommunicator::*_async handle
/// A device family's memory, copies and streams (loom/device.h).
inline constexpr InterfaceInfo kDeviceRuntime{"device_runtime", 1, 1};

/// Every kind a factory may be registered for, in the order `loom plugins list` prints.
inline constexpr InterfaceInfo kComponentKinds[] = {
    kModel,     kLayer,      kModule,           kAttention,        kMlp,
    kNorm,      kMixer,      kRouter,           kMoeDispatcher,    kFp8Recipe,
    kOptimizer, kLrSchedule, kPipelineSchedule, kCheckpointFormat, kCommBackend,
};

}  // namespace loom::kinds
