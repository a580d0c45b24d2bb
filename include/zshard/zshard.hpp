#pragma once
// The whole library in one include: the engine with its default policies, the host backend
// and the thread communicator. Include individual headers to pull in less.
#include "zshard/backend/host_backend.hpp"
#include "zshard/comm/thread_comm.hpp"
#include "zshard/core/buffer.hpp"
#include "zshard/core/dtype.hpp"
#include "zshard/core/error.hpp"
#include "zshard/core/memory_ledger.hpp"
#include "zshard/engine/default_policies.hpp"
#include "zshard/engine/engine.hpp"
#include "zshard/model/model_spec.hpp"
