#pragma once
// The library's CPU side in one include: the engine with its default policies, the host and
// phantom backends, the thread and null communicators, the host Offloader and the memory
// planner. CUDA and NCCL headers (backend/cuda_backend.hpp, comm/nccl_comm.hpp, comm/nccl_ranks.hpp) are included
// separately, from translation units built with nvcc.
#include "zshard/backend/host_backend.hpp"
#include "zshard/backend/phantom_backend.hpp"
#include "zshard/comm/null_comm.hpp"
#include "zshard/comm/thread_comm.hpp"
#include "zshard/offload/host_adam.hpp"
#include "zshard/plan/memory_plan.hpp"
#include "zshard/plan/policy_options.hpp"
#include "zshard/core/buffer.hpp"
#include "zshard/core/dtype.hpp"
#include "zshard/core/error.hpp"
#include "zshard/core/memory_ledger.hpp"
#include "zshard/engine/default_policies.hpp"
#include "zshard/engine/engine.hpp"
#include "zshard/model/model_spec.hpp"
