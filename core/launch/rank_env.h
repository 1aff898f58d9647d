// Which rank this process is, read from the environment that started it: `loom launch`,
// Slurm's srun, or Open MPI's mpirun (DESIGN.md section 5).
#pragma once

#include <string>

namespace loom::core::launch {

/// This process's place in the run.
struct RankEnv {
  int rank = 0;              ///< global rank, in [0, world_size)
  int world_size = 1;        ///< number of ranks in the run
  int local_rank = 0;        ///< rank on this machine, in [0, local_world_size)
  int local_world_size = 1;  ///< ranks on this machine
  int node_rank = 0;         ///< this machine, in [0, nnodes)
  int nnodes = 1;            ///< machines in the run
  std::string rdzv;          ///< rendezvous address (open_store); empty for a single rank
  std::string run_id;        ///< key prefix shared by every rank of the run
  std::string launcher;      ///< "single", "loom", "slurm" or "mpirun"
  bool distributed() const { return world_size > 1; }
};

/// Reads the rank environment, the first that is present winning:
///  - `loom launch`: LOOM_RANK, LOOM_WORLD_SIZE, LOOM_LOCAL_RANK, LOOM_LOCAL_WORLD_SIZE,
///    LOOM_NODE_RANK, LOOM_NNODES, LOOM_RDZV, LOOM_RUN_ID (present when LOOM_RANK is);
///  - Slurm (SLURM_PROCID): SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE or
///    SLURM_TASKS_PER_NODE ("2(x3),1"), SLURM_NODEID, SLURM_NNODES; run id LOOM_RUN_ID or
///    "slurm-JOB.STEP" (SLURM_JOB_ID, SLURM_STEP_ID);
///  - Open MPI (OMPI_COMM_WORLD_RANK): OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK,
///    OMPI_COMM_WORLD_LOCAL_SIZE; run id LOOM_RUN_ID or the job's PMIx namespace;
///  - none of them: a single rank (launcher "single").
/// Under Slurm and mpirun the rendezvous address is LOOM_RDZV (a directory on a shared file
/// system, or redis://HOST:PORT).
/// Throws core::UsageError naming the variable when a value is not an integer or out of
/// range (rank >= world size, ...), or when a run of several ranks has no LOOM_RDZV.
RankEnv detect_rank_env();

}  // namespace loom::core::launch
