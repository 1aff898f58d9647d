// The module toolkit of the SDK (loom::nn), header-only: what a model plugin builds its
// modules with, so that every plugin (transformer, moe, mamba, a third party's) shares one
// tested piece instead of its own copy.
//
//   nn/module_base.h      ModuleBase<I>: parameters, children and the IModule entry points
//   nn/linear.h           Linear: dense GEMM sites with FP8 and deferred weight gradients
//   nn/tensor_parallel.h  TensorParallel: column/row-parallel and sequence-parallel regions
//   nn/context_parallel.h ContextParallelAttention: attention over a sequence split across ranks
//   nn/child.h            building children from spec slots, calling their forward/backward
//   nn/views.h            shape checks, flat views, saving/loading, context capabilities
//   nn/qkv_views.h        a fused QKV projection's output as attention's q, k, v in place
//   nn/recompute.h        ForwardOnlyContext / RerunContext for full recomputation
//   nn/options.h          reading options (inherited ones included), spec-pointer messages
//   nn/pipeline_stage.h   which layers a pipeline stage owns (even split, Megatron layouts)
#pragma once

#include <loom/cpp/nn/child.h>
#include <loom/cpp/nn/context_parallel.h>
#include <loom/cpp/nn/linear.h>
#include <loom/cpp/nn/module_base.h>
#include <loom/cpp/nn/options.h>
#include <loom/cpp/nn/pipeline_stage.h>
#include <loom/cpp/nn/qkv_views.h>
#include <loom/cpp/nn/recompute.h>
#include <loom/cpp/nn/tensor_parallel.h>
#include <loom/cpp/nn/views.h>
