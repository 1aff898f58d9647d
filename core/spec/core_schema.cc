// The schema of the core's own spec sections. Components (model, optimizer, ...) are
// `x-loom-component` slots: their options are checked against the schema of whatever
// implementation the spec selects.
#include <nlohmann/json.hpp>

#include "core/spec/spec.h"

namespace loom::core {
namespace {

constexpr const char* kCoreSchema = R"json({
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "model": {"x-loom-component": "model", "description": "the network"},
    "parallel": {
      "type": "object", "default": {}, "additionalProperties": false,
      "description": "process grid sizes, in Megatron's order tp, cp, ep, dp, pp",
      "properties": {
        "tp": {"type": "integer", "minimum": 1, "default": 1, "description": "tensor parallel"},
        "cp": {"type": "integer", "minimum": 1, "default": 1, "description": "context parallel: each sequence split over cp ranks (2 cp chunks, rank r holding chunks r and 2cp-1-r)"},
        "cp_comm_type": {"enum": ["p2p", "all_gather"], "default": "p2p",
                         "description": "Megatron's --cp-comm-type: p2p passes key/value blocks around a ring, overlapped with the attention of the block at hand; all_gather gathers every rank's keys and values first"},
        "ep": {"type": "integer", "minimum": 1, "default": 1, "description": "expert parallel: the ranks (among the data replicas) that own different experts of each MoE layer"},
        "etp": {"type": ["integer", "null"], "minimum": 1, "default": null, "description": "expert tensor parallel: ranks splitting each expert (null: tp, as Megatron's --expert-tensor-parallel-size); experts fold over the same ranks as etp x ep x edp"},
        "dp": {"type": "integer", "minimum": 1, "default": 1, "description": "data parallel"},
        "pp": {"type": "integer", "minimum": 1, "default": 1, "description": "pipeline parallel"},
        "vpp": {"type": "integer", "minimum": 1, "default": 1,
                "description": "virtual pipeline chunks per pipeline rank (inferred from pipeline_layout when left at 1)"},
        "pipeline_layout": {"type": "string",
                            "description": "Megatron's --pipeline-model-parallel-layout: the virtual stages cut by '|', E the embedding, t a decoder layer, L the loss, (X)*n and c*n repeat, e.g. \"Et*3|(tt|)*29,m|L\"; the stages must be a multiple of pp"},
        "num_layers_in_first_pipeline_stage": {"type": "integer", "minimum": 1,
                                               "description": "layers of the first pipeline rank (over its virtual chunks); the other ranks split the rest evenly"},
        "num_layers_in_last_pipeline_stage": {"type": "integer", "minimum": 1,
                                              "description": "layers of the last pipeline rank (over its virtual chunks)"},
        "account_for_embedding_in_pipeline_split": {"type": "boolean", "default": false,
                                                    "description": "the embedding counts as one layer of the first stage in the even split"},
        "account_for_loss_in_pipeline_split": {"type": "boolean", "default": false,
                                               "description": "the loss counts as one layer of the last stage in the even split"},
        "sequence_parallel": {"type": "boolean", "default": false},
        "distributed_optimizer": {"type": "boolean", "default": false,
                                  "description": "ZeRO-1: shard master weights and optimizer states over dp (reduce-scatter gradients, all-gather parameters)"},
        "bucket_size": {"type": "integer", "minimum": 0, "default": 40000000,
                        "description": "elements per gradient bucket reduced at once (0: one bucket for the whole model)"},
        "overlap_grad_reduce": {"type": "boolean", "default": true,
                                "description": "start reducing a gradient bucket during the last micro-batch's backward, as soon as its gradients are final (false: after backward)"},
        "timeout_s": {"type": "number", "exclusiveMinimum": 0, "default": 300,
                      "description": "timeout of every collective and of the rendezvous: a dead or stuck rank stops the others after this long"},
        "pipeline_schedule": {"x-loom-component": "pipeline_schedule"},
        "comm_backend": {"x-loom-component": "comm_backend"},
        "device_comm_backend": {"x-loom-component": "comm_backend",
                                "description": "collectives on device tensors (default nccl when /train/device is cuda); host tensors keep comm_backend"}
      }
    },
    "precision": {
      "type": "object", "default": {}, "additionalProperties": false,
      "properties": {
        "params": {"enum": ["f32", "bf16", "f16"], "default": "f32",
                   "description": "dtype of parameters and activations"},
        "master_weights": {"enum": ["f32"], "default": "f32"},
        "initial_loss_scale": {"type": "number", "exclusiveMinimum": 0, "default": 65536,
                               "description": "f16 only: dynamic loss scaling start"},
        "min_loss_scale": {"type": "number", "exclusiveMinimum": 0, "default": 1},
        "loss_scale_window": {"type": "integer", "minimum": 1, "default": 1000},
        "hysteresis": {"type": "integer", "minimum": 1, "default": 2},
        "fp8": {"x-loom-component": "fp8_recipe"},
        "fp8_weight_cache": {"type": "boolean", "default": true,
                             "description": "with fp8 and several micro-batches a step: each FP8 weight is quantised once a step and kept for the step's other micro-batches (Transformer Engine's weight caching; Megatron's disable_parameter_transpose_cache false); off: quantised in every micro-batch, the same bits"}
      }
    },
    "optimizer": {"x-loom-component": "optimizer"},
    "lr_schedule": {"x-loom-component": "lr_schedule"},
    "data": {
      "type": "object", "default": {}, "additionalProperties": false,
      "properties": {
        "paths": {"type": "array", "items": {"type": ["string", "number"]},
                  "description": "dataset prefixes, optionally preceded by blend weights"},
        "split": {"type": "string", "pattern": "^[0-9.]+(,[0-9.]+){0,2}$", "default": "949,50,1",
                  "description": "train,valid,test weights over each dataset's documents"},
        "cache_dir": {"type": "string", "minLength": 1,
                      "description": "where GPT dataset indices are cached; default <first prefix's dir>/cache/GPTDataset_indices"},
        "tokenizer": {"type": "object", "additionalProperties": false, "required": ["path"],
                      "properties": {
                        "path": {"type": "string", "minLength": 1,
                                 "description": "tokenizer.json, or a directory with vocab.json + merges.txt"}
                      },
                      "description": "the tokenizer the data was written with (its EOD id; its size is checked against the model)"},
        "eod_id": {"type": "integer", "minimum": 0,
                   "description": "end-of-document id; default: the tokenizer's"},
        "eod_mask_loss": {"type": "boolean", "default": false,
                          "description": "no loss where the input token is EOD"},
        "reset_position_ids": {"type": "boolean", "default": false,
                               "description": "positions restart after each EOD"},
        "reset_attention_mask": {"type": "boolean", "default": false,
                                 "description": "tokens attend only within their document"},
        "corpus": {
          "type": "object", "additionalProperties": false, "required": ["inputs"],
          "description": "raw text that loom tokenises on first use (training a tokenizer when none is given) and caches as an indexed dataset",
          "properties": {
            "inputs": {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1},
                       "description": "files or directories: .txt, .jsonl, .html"},
            "exclude": {"type": "array", "items": {"type": "string", "minLength": 1}, "default": [],
                        "description": "file-name patterns to leave out (* and ? wildcards)"},
            "json_key": {"type": "string", "minLength": 1, "default": "text"},
            "vocab_size": {"type": "integer", "minimum": 257, "default": 8192,
                           "description": "size of the byte-level BPE vocabulary trained on the corpus"},
            "cache_dir": {"type": "string", "minLength": 1,
                          "description": "default $XDG_CACHE_HOME/loom/corpora (~/.cache/loom/corpora)"}
          }
        },
        "mock": {"type": "boolean", "default": false,
                 "description": "synthetic Markov-chain tokens (Megatron's --mock-data), for benchmarks and smoke tests"},
        "token_file": {"type": "string", "minLength": 1,
                       "description": "a flat file of token ids (little-endian), cut into seq_length + 1 windows"},
        "token_dtype": {"enum": ["u16", "i32"], "default": "u16",
                        "description": "element type of token_file"},
        "vocab_size": {"type": "integer", "minimum": 1,
                       "description": "ids must be below it; default /model/vocab_size"}
      }
    },
    "train": {
      "type": "object", "default": {}, "additionalProperties": false,
      "properties": {
        "steps": {"type": "integer", "minimum": 1, "default": 1000},
        "micro_batch_size": {"type": "integer", "minimum": 1, "default": 1},
        "global_batch_size": {"type": "integer", "minimum": 1,
                              "description": "default: micro_batch_size x dp"},
        "seq_length": {"type": "integer", "minimum": 1, "default": 1024},
        "seed": {"type": "integer", "minimum": 0, "default": 1234},
        "device": {"enum": ["cpu", "cuda"], "default": "cpu"},
        "grad_clip": {"type": "number", "minimum": 0, "default": 1.0},
        "log_interval": {"type": "integer", "minimum": 1, "default": 10},
        "eval_interval": {"type": "integer", "minimum": 1, "default": 100},
        "eval_steps": {"type": "integer", "minimum": 1, "default": 10},
        "max_nonfinite_steps": {"type": "integer", "minimum": 1, "default": 3},
        "rerun_mode": {"enum": ["disabled", "validate_results"], "default": "disabled",
                       "description": "validate_results: a step whose loss or gradient norm is non-finite (or, with check_for_spiky_loss, spiky) is run again on the same data; the log says whether the fault reproduced (the data or the model) or not (a transient fault: the step goes on with the rerun); Megatron's --rerun-mode"},
        "check_for_spiky_loss": {"type": "boolean", "default": false,
                                 "description": "with rerun_mode validate_results, also rerun a step whose loss is at least spiky_loss_factor times the largest loss of the first spiky_loss_samples steps"},
        "spiky_loss_factor": {"type": "number", "minimum": 1, "default": 10},
        "spiky_loss_samples": {"type": "integer", "minimum": 1, "default": 100},
        "recompute": {"enum": ["none", "selective", "full"], "default": "none"},
        "cuda_graph": {"enum": ["none", "forward_backward", "step"], "default": "none",
                       "description": "forward_backward: after cuda_graph_warmup_steps steps run directly, each micro-batch's forward and backward run as one captured CUDA graph, replayed (Megatron's --enable-cuda-graph / --cuda-graph-scope); needs a device whose runtime captures graphs, one process, and no dropout. step: that, and the optimizer's part of the step (gradient norm, clipping, update) as a second graph with the learning rate and step read on the device (Megatron's --optimizer-cuda-graph); also needs an optimizer of optimizer 1.3, no result validation and no experts"},
        "cuda_graph_warmup_steps": {"type": "integer", "minimum": 1, "default": 3,
                                    "description": "steps run directly before the capture, so lazily made kernel plans and buffers exist (Megatron's --cuda-graph-warmup-steps)"}
      }
    },
    "checkpoint": {
      "type": "object", "default": {}, "additionalProperties": false,
      "properties": {
        "format": {"x-loom-component": "checkpoint_format",
                   "description": "how checkpoints are written; default {\"impl\": \"sharded\"}"},
        "dir": {"type": "string", "minLength": 1,
                "description": "checkpoint root; default <run_dir>/checkpoints"},
        "interval": {"type": "integer", "minimum": 1,
                     "description": "save every this many steps; default: only at the end"},
        "keep": {"type": "integer", "minimum": 0, "default": 3,
                 "description": "complete checkpoints kept (older ones are deleted); 0 keeps all"},
        "resume": {"enum": ["none", "auto"], "default": "none",
                   "description": "auto: continue from the newest good checkpoint in dir"},
        "async": {"type": "boolean", "default": false,
                  "description": "write checkpoints in the background from a snapshot"},
        "save_at_end": {"type": "boolean", "default": true,
                        "description": "save when the run reaches train.steps"},
        "init_from": {"type": "string", "minLength": 1,
                      "description": "start from these model weights (a loom checkpoint or a Hugging Face directory); optimizer state and iteration start fresh"}
      }
    },
    "plugins": {
      "type": "object", "default": {}, "additionalProperties": false,
      "properties": {
        "search_paths": {"type": "array", "items": {"type": "string", "minLength": 1},
                         "default": [],
                         "description": "directories searched first, relative to the spec"},
        "load": {"type": "array", "items": {"type": "string", "minLength": 1}, "default": [],
                 "description": "plugins loaded even when no impl names them"},
        "options": {"type": "object", "default": {},
                    "additionalProperties": {"type": "object"},
                    "description": "per-plugin init options, by plugin name"}
      }
    },
    "kernels": {
      "type": "object", "default": {}, "additionalProperties": false,
      "properties": {
        "pin": {"type": "object", "default": {}, "additionalProperties": {"type": "string"},
                "description": "op name -> kernel name that must serve it; \"none\": no kernel serves it, for an op modules can do without (gemm_epilogue: the layers then run its unfused sequence)"},
        "libraries": {"type": "array", "items": {"type": "string", "minLength": 1}, "default": [],
                      "description": "kernel plugins to load; default kernels_<train.device>"}
      }
    },
    "log": {
      "type": "object", "default": {}, "additionalProperties": false,
      "properties": {
        "level": {"enum": ["debug", "info", "warning", "error"], "default": "info"},
        "run_dir": {"type": "string",
                    "description": "where metrics and the resolved spec go; default runs/<spec name>"},
        "straggler_factor": {"type": "number", "minimum": 1, "default": 2,
                             "description": "with several ranks, a log line names the slowest rank when its compute time per step (step time less the time blocked in communication) is at least this many times the fastest rank's"},
        "trace_steps": {"type": "integer", "minimum": 0, "default": 3,
                        "description": "steps (from step 2, after the first) whose pipeline actions every rank records into RUN_DIR/pipeline_trace.json, a Chrome trace (Perfetto, chrome://tracing); 0 records none; runs without pipeline parallelism record none"},
        "sample": {
          "type": "object", "additionalProperties": false,
          "description": "text generated from the trained model at the end of the run",
          "properties": {
            "prompt": {"type": "string", "default": ""},
            "max_new_tokens": {"type": "integer", "minimum": 1, "default": 48},
            "temperature": {"type": "number", "minimum": 0, "default": 0.8},
            "top_k": {"type": "integer", "minimum": 0, "default": 40},
            "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1, "default": 1.0},
            "seed": {"type": "integer", "minimum": 0, "default": 0}
          }
        }
      }
    }
  }
})json";

}  // namespace

const nlohmann::json& core_spec_schema() {
  static const nlohmann::json schema = nlohmann::json::parse(kCoreSchema);
  return schema;
}

}  // namespace loom::core
