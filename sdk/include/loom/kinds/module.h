// IModule: the common shape of every trainable part (model, layer, attention, mlp, norm,
// mixer, router, any other module), and IForwardContext, the per-micro-batch state.
//
// A module declares its parameters with their parallel layout; the core allocates them
// (and their gradients) and binds views. Forward and backward are explicit and side by
// side. Anything backward needs is saved in the forward context, never in the module, so a
// pipeline schedule can keep several micro-batches in flight. Activation recomputation is
// a policy of the context (DESIGN.md section 4).
//
// Module kinds 1.1 (ABI 1.5) append to IModule backward_weight (the deferred weight-gradient
// pass of zero-bubble schedules) and step_end (a per-step hook); forward_context 1.4
// appends defer_weight_grads and metric, forward_context 1.5 (ABI 1.6) aux_loss_weight,
// forward_context 1.6 (ABI 1.7) IKvCache::state (the decoding state of layers other than
// attention), forward_context 1.7 (ABI 1.12) loss_grad (the loss's gradient, known during
// the forward), forward_context 1.8 (ABI 1.17) grad_first_write (whether a write of a
// kParamGradOverwrite gradient is the step's first, which may then overwrite). The core calls a 1.1
// method only on an object whose interface_info() says 1.1 or later, and a module checks the
// context's minor before calling a 1.4 method or a later one (loom/cpp/nn/views.h has the checks).
#pragma once

#include <stdint.h>

#include "loom/object.h"
#include "loom/status.h"
#include "loom/types.h"

namespace loom {

/// Flags of a parameter (ParamInfo::flags).
enum ParamFlags : uint32_t {
  kParamNone = 0,
  kParamNoWeightDecay = 1u << 0,     ///< norms and biases: AdamW skips decay
  kParamSequenceParallel = 1u << 1,  ///< replicated in TP but computed on sequence shards:
                                     ///< its gradient is all-reduced over the TP group
  kParamExpert = 1u << 2,            ///< owned by one expert-parallel rank (expert_index)
  kParamTiedEmbedding = 1u << 3,     ///< shared between embedding and output layer
  kParamFrozen = 1u << 4,            ///< no gradient, not updated
  /// Every write of its gradient asks IForwardContext::grad_first_write first (ABI 1.17):
  /// the step's first write overwrites the gradient (a GEMM with beta 0, which does not
  /// read it), the later ones add. The core may then skip the gradient's zero fill, so a
  /// write that did not ask would add to an earlier step's values: a module sets the flag
  /// only on a parameter whose every gradient write is its own and asks (not a tied or
  /// shared one).
  kParamGradOverwrite = 1u << 5,
};

/// How a parameter starts out (ParamInfo::init).
enum class ParamInit : int32_t {
  kZeros = 0,
  kOnes = 1,
  kNormal = 2,        ///< normal(0, init_std)
  kScaledNormal = 3,  ///< output projections: normal(0, init_std) where the module has
                      ///< already divided init_std by sqrt(2 * num_layers) (Megatron)
  kUniform = 4,       ///< uniform(-init_std, init_std)
  kCustom = 5,        ///< the module fills it in IModule::init_param
};

/// One parameter declared by a module, with its parallel layout. The layout is what the
/// optimizer, the gradient reduction and the checkpoint formats read; nothing guesses it.
struct ParamInfo {
  uint32_t struct_size;            ///< sizeof(ParamInfo) of the module's library
  const char* name;                ///< name within the module, e.g. "weight"; static
  DType dtype;                     ///< storage dtype of the parameter
  int32_t ndim;                    ///< rank of the shapes below
  int64_t shape[kMaxDims];         ///< shape on this rank
  int64_t global_shape[kMaxDims];  ///< shape of the whole tensor across ranks
  int32_t tp_split_dim;            ///< dimension split over the TP group (over the expert
                                   ///< tensor-parallel group, etp, for a kParamExpert
                                   ///< parameter), -1 if none
  int32_t expert_index;            ///< global expert id when kParamExpert, else -1
  uint32_t flags;                  ///< ParamFlags
  ParamInit init;                  ///< initialisation rule
  float init_std;                  ///< scale for kNormal / kScaledNormal / kUniform
  /// Rows of dimension 0 of the whole tensor that hold the model's values; the rows from
  /// valid_rows to global_shape[0] are padding (a vocabulary padded to a multiple of
  /// make_vocab_size_divisible_by x tp, so that its GEMMs get aligned shapes). The core
  /// initialises padding to 0, the module keeps it out of every result (so its gradient is
  /// 0 and it stays 0), and checkpoints and exports hold only the valid rows: a checkpoint
  /// loads into any padding. 0 (or global_shape[0]): no padding. Read only when
  /// struct_size covers it (a module built against an older SDK has none).
  int64_t valid_rows;
};

/// Activation recomputation policy of a forward context.
enum class RecomputePolicy : int32_t {
  kNone = 0,       ///< save what backward needs
  kSelective = 1,  ///< recompute the attention core (and modules that opt in)
  kFull = 2,       ///< save only module inputs, rerun forward in backward
};

/// How a step combines the values a metric was reported with (IForwardContext::metric):
/// over every report of the step, from every micro-batch and every rank.
enum class MetricReduce : int32_t {
  kMean = 0,  ///< the arithmetic mean of the reports (an aux loss, a load-balance loss)
  kMax = 1,   ///< the largest report (a load imbalance: max over mean tokens per expert)
};

/// The end of an optimizer step, as IModule::step_end sees it.
struct StepEvent {
  uint32_t struct_size;  ///< sizeof(StepEvent) of the core
  int64_t step;          ///< the 1-based step that just ended
  int32_t skipped;       ///< 1 when the step made no update (non-finite loss or gradients)
  double lr;             ///< the learning rate of the step
};

/// Keys and values of earlier positions, for incremental decoding (`loom generate`): each
/// forward pass then carries only the new tokens, and every attention layer attends over
/// the cached positions plus the new ones. Owned by the core, which advances it by the
/// number of new tokens after each whole forward pass of the model.
class IKvCache {
 public:
  /// Positions already cached before this forward pass (the same for every layer). The
  /// new tokens sit at positions past_length() .. past_length() + T - 1.
  virtual int64_t past_length() const noexcept = 0;
  /// Appends one layer's keys and values of the new tokens and returns views of every
  /// cached position, old and new.
  /// \param owner       the layer (its `this`): each layer has its own slot
  /// \param k, v        (B, T, G, D) keys (after rotary embedding) and (B, T, G, Dv) values of
  ///                    the new tokens; Dv may differ from D from forward_context 1.6 on (a
  ///                    multi-latent attention layer caches its two latents this way)
  /// \param[out] k_all  (B, past_length() + T, G, D), contiguous, same dtype and device
  /// \param[out] v_all  (B, past_length() + T, G, Dv)
  /// The views stay valid until the next `append` for the same owner. Fails with
  /// kOutOfRange when the cache's capacity (the longest sequence it was made for) would be
  /// exceeded.
  virtual Status append(const void* owner, const TensorView* k, const TensorView* v,
                        TensorView* k_all, TensorView* v_all) noexcept = 0;

  // ---- Reached through a forward_context 1.6 (ABI 1.7) or later: a context of an older
  // ---- core hands out a cache without this method (loom::nn::kv_state_of checks). ----

  /// A decoding state of fixed shape that a layer carries from one forward pass to the next
  /// (a Mamba mixer's convolution window and SSM state): one tensor per (owner, slot), made
  /// on first use and kept, with its contents, until the cache is destroyed. Its contents
  /// are the layer's: it reads them when past_length() > 0 and writes them in every pass; at
  /// past_length() == 0 (a new sequence, or after the owner of the cache reset it) they are
  /// stale and must not be read.
  /// \param owner        the layer (its `this`)
  /// \param slot         which of the owner's states (0, 1, ...)
  /// \param dtype, ndim, shape  the state's dtype and shape (B, ...): B is the cache's batch;
  ///                     the same every call for an (owner, slot)
  /// \param[out] state   the contiguous tensor, on the cache's device
  /// Fails with kInvalidArgument when the shape's leading dimension is not the cache's batch
  /// or when an (owner, slot) asks for another dtype or shape than before.
  virtual Status state(const void* owner, int32_t slot, DType dtype, int32_t ndim,
                       const int64_t* shape, TensorView* state) noexcept = 0;

 protected:
  ~IKvCache() = default;
};

/// State of one micro-batch between its forward and its backward. Owned by the core.
class IForwardContext {
 public:
  /// kinds::kForwardContext.
  virtual InterfaceInfo interface_info() const noexcept = 0;
  /// True in training (dropout on, tensors saved for backward).
  virtual bool training() const noexcept = 0;
  /// The recomputation policy for this micro-batch.
  virtual RecomputePolicy recompute() const noexcept = 0;
  /// Index of the micro-batch within the step (for RNG streams and debugging).
  virtual int32_t micro_batch() const noexcept = 0;
  /// Allocates an activation tensor that lives until the context is released, or until
  /// `release` (1.3) when nothing saved refers to it.
  /// \param dtype, ndim, shape  what to allocate (contiguous)
  /// \param device              where
  /// \param[out] out            the view
  virtual Status allocate(DType dtype, int32_t ndim, const int64_t* shape, Device device,
                          TensorView* out) noexcept = 0;
  /// Keeps `tensor` for backward under (owner, slot). The context takes a reference: the
  /// memory must come from `allocate` of this context or be a bound parameter.
  /// \param owner  the module saving it (its `this`), so slots of modules do not clash
  /// \param slot   small integer chosen by the module
  virtual Status save(const void* owner, int32_t slot, const TensorView* tensor) noexcept = 0;
  /// Returns what `save` kept under (owner, slot); kNotFound when nothing was saved.
  virtual Status load(const void* owner, int32_t slot, TensorView* out) noexcept = 0;
  /// A Philox-style counter-based random stream for (owner, purpose), reproducible for
  /// the run's seed, the step and the micro-batch: returns the key and the first counter.
  virtual void rng(const void* owner, uint64_t purpose, uint64_t* key,
                   uint64_t* counter) noexcept = 0;
  /// The key/value cache of an incremental decoding pass, or null (training, evaluation,
  /// any full-sequence forward). Never set when training() is true. (Interface 1.1.)
  virtual IKvCache* kv_cache() noexcept = 0;
  /// A module calls it when its backward has finished accumulating into the gradients of
  /// the parameters it declares directly (owner = the module as an IModule*, its `this`:
  /// the same id as for save and rng); the core may start reducing them (data
  /// parallelism: while the rest of backward runs). Only when nothing later in this
  /// backward pass accumulates into them: of modules sharing a parameter (tied weights),
  /// the one that declares it must be the one whose backward runs last. Calling it is
  /// optional (the core reduces everything after backward anyway) and harmless more than
  /// once. Check interface_info() for minor >= 2 before calling it: an older core's
  /// context has no such method. (Interface 1.2.)
  virtual void grads_ready(const void* owner) noexcept = 0;
  /// The caller is done with `tensor`, memory it got from `allocate` of this context (its
  /// own, or an output a child module returned to it): the memory is freed as soon as no
  /// saved entry (`save`) refers to it, instead of when the context is released. Release
  /// each allocation once, through any view into it; never release a module input you did
  /// not get as a child's output, a tensor you returned, or a parameter. Fails with
  /// kInvalidArgument when the tensor is not live memory of this context (released twice,
  /// or never allocated here). Check interface_info() for minor >= 3 before calling it.
  /// (Interface 1.3.)
  /// \param tensor  any view into the allocation (its data pointer locates it)
  virtual Status release(const TensorView* tensor) noexcept = 0;
  /// Forgets every tensor `owner` saved: call it when the owner's backward no longer needs
  /// them. Memory that was released is freed once no other entry refers to it; memory
  /// that was never released stays until the context is. (Interface 1.3.)
  /// \param owner  the id the module saved under (its `this`)
  virtual void drop_saved(const void* owner) noexcept = 0;

  // ---- forward_context 1.4 (ABI 1.5): check interface_info().minor >= 4 first. ----

  /// True when this micro-batch's backward is split (a zero-bubble pipeline schedule): the
  /// module's backward computes the input gradients only, and the weight gradients it can
  /// defer come later, in IModule::backward_weight on this same context. A module that
  /// cannot defer computes everything in backward as usual (correct, only less overlap);
  /// one that defers keeps what its weight gradients need until backward_weight and calls
  /// grads_ready there instead of after backward. loom::nn::ModuleBase implements the
  /// protocol. False in forward-only and unsplit contexts.
  virtual bool defer_weight_grads() const noexcept = 0;
  /// Reports a number of this micro-batch for the run's log line and metrics.jsonl (an aux
  /// loss, a load imbalance): every report of `name` in a step is combined by `reduce` over
  /// the micro-batches and the ranks, and the step's value is shown beside the loss. The
  /// value is read when the core chooses (it copies it at once on a device, without waiting
  /// for the device), so the caller may release it after the call. Names are free text
  /// without spaces, e.g. "moe/aux_loss/layer_3"; reports outside training are ignored.
  /// \param name    what is measured
  /// \param value   an f32 tensor of one element on the context's device
  /// \param reduce  how the step combines the reports
  virtual Status metric(StringView name, const TensorView* value, MetricReduce reduce) noexcept = 0;

  // ---- forward_context 1.5 (ABI 1.6): check interface_info().minor >= 5 first. ----

  /// The weight of this micro-batch's own loss terms in what the step minimises: a module
  /// that adds a term of its own to the objective (an MoE router's load-balancing or z-loss,
  /// Megatron's MoEAuxLossAutoScaler) seeds that term's gradient with it, so the term counts
  /// as much as the micro-batch's mean loss does: the run's loss scale over the step's
  /// micro-batches. Each rank adds its own share of a term (its tokens' part); the core
  /// averages the data-parallel replicas as it does for the loss. 0 outside training.
  virtual double aux_loss_weight() const noexcept = 0;

  // ---- forward_context 1.7 (ABI 1.12): check interface_info().minor >= 7 first. ----

  /// The gradient this micro-batch's backward will receive for the model's loss (the
  /// model's grad_outputs[0], an f32 scalar on the model's device), already holding its
  /// value while the forward runs; null when it is not known before the forward: outside
  /// training, on a pipeline stage other than the last, and under context parallelism (each
  /// rank's share of it depends on every rank's token count, known after the forward). The
  /// core then passes this very view as grad_outputs[0]. A model may compute its loss's
  /// gradient during the forward with it (the fused cross_entropy_fwd_bwd, which frees the
  /// logits' memory for their gradient), and checks in backward that grad_outputs[0] is this
  /// view (loom::nn::loss_grad_of).
  virtual const TensorView* loss_grad() const noexcept = 0;

  // ---- forward_context 1.8 (ABI 1.17): check interface_info().minor >= 8 first. ----

  /// Whether the write about to be made into `grad`, the bound gradient of a
  /// kParamGradOverwrite parameter (or a view of it from its first element), is the first
  /// of this optimizer step: 1 at most once per parameter and step, when the core grants it;
  /// the writer must then overwrite the whole gradient (the core may have skipped its zero
  /// fill, leaving an earlier step's values), and it adds on 0. 0 otherwise, and always for
  /// any other tensor, outside training, and where the core does not grant it (a pass
  /// replayed from a device graph for several micro-batches, or LOOM_GRAD_FIRST_WRITE=off).
  /// Ask right before the write, once per write (the answer marks the gradient written).
  virtual int32_t grad_first_write(const TensorView* grad) noexcept = 0;

  // ---- forward_context 1.9 (ABI 1.18): check interface_info().minor >= 9 first. ----

  /// An id of the parameter values this pass computes with, for a module that keeps what it
  /// derives from its parameters across the micro-batches of a step (nn::Linear's FP8
  /// copies of its weights: Transformer Engine's weight caching, which Megatron asks for
  /// with is_first_microbatch). Two passes with the same nonzero id see the same parameter
  /// values, and the same FP8 scales: what the first derived serves the second. A
  /// different id means the parameters may have changed: derive again. 0: keep nothing
  /// across passes. The core gives each training step of several micro-batches a new id
  /// (parameters change only between steps) and 0 outside training, to a step of one
  /// micro-batch (nothing to share), to a pass captured into a device graph
  /// (train.cuda_graph: a replay would skip the derivation the next step needs) and when
  /// /precision/fp8_weight_cache is false.
  virtual uint64_t param_version() const noexcept = 0;
};

/// Base of every trainable module. Inputs and outputs are positional; each kind's header
/// documents its own positions and shapes.
class IModule : public IObject {
 public:
  /// Number of parameters this module declares directly (children declare their own).
  virtual int32_t param_count() const noexcept = 0;
  /// Describes parameter `index` in [0, param_count()). The caller sets out->struct_size to
  /// its sizeof(ParamInfo); the module writes at most that many bytes (loom::copy_struct).
  virtual Status param_info(int32_t index, ParamInfo* out) const noexcept = 0;
  /// Gives the module the storage of parameter `index` and of its gradient (the core owns
  /// both; the gradient view is accumulated into by backward, never overwritten).
  virtual Status bind_param(int32_t index, const TensorView* param,
                            const TensorView* grad) noexcept = 0;
  /// Fills parameter `index` when its init is kCustom.
  virtual Status init_param(int32_t index, uint64_t seed) noexcept = 0;
  /// Number of child modules (built from the spec node's child slots).
  virtual int32_t child_count() const noexcept = 0;
  /// Child `index` and its name ("attention", "layers.3").
  virtual Status child(int32_t index, StringView* name, IModule** out) noexcept = 0;

  /// Forward pass.
  /// \param ctx       the micro-batch context
  /// \param inputs    [num_inputs] input views
  /// \param[out] outputs  [num_outputs]; the module allocates them from ctx
  virtual Status forward(IForwardContext* ctx, const TensorView* inputs, int32_t num_inputs,
                         TensorView* outputs, int32_t num_outputs) noexcept = 0;
  /// Backward pass: gradients of the outputs in, gradients of the inputs out (allocated
  /// from ctx; an input that needs no gradient gets a view with data == null), and the
  /// parameter gradients accumulated into the bound grad views.
  virtual Status backward(IForwardContext* ctx, const TensorView* grad_outputs,
                          int32_t num_grad_outputs, TensorView* grad_inputs,
                          int32_t num_grad_inputs) noexcept = 0;

  // ---- module kinds 1.1 (ABI 1.5): the core checks interface_info().minor >= 1 first. ----

  /// The weight gradients this module (and its children) deferred in a backward on `ctx`
  /// whose defer_weight_grads() was true: they are accumulated into the bound gradient
  /// views now, and what was kept for them is dropped. Called once per such backward, on
  /// the same context, before the context is released. A module passes it on to its
  /// children, in the order of its backward (the core calls only the model's); a module
  /// that deferred nothing (or cannot defer) does nothing but that.
  virtual Status backward_weight(IForwardContext* ctx) noexcept = 0;
  /// The end of an optimizer step: after the gradients were reduced and the optimizer ran
  /// (or the step was skipped). The core calls it on every module of the tree, in tree
  /// order, the same on every rank; a module does not pass it on to its children. For
  /// state that changes once per step outside the optimizer (an MoE router's expert bias
  /// updated from the step's token counts). Collectives are allowed (every rank calls it).
  virtual Status step_end(const StepEvent* event) noexcept = 0;

 protected:
  ~IModule() = default;
};

}  // namespace loom
