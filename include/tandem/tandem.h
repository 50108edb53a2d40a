// Umbrella header: everything a training program needs from tandem (one include for the public
// API of every layer: errors and trace, checkpoints, collectives and codecs, the runtime).
//
// Ownership: declares nothing of its own; each included header states its contract.
// Thread-safety: as each included header says. Errors: as each included header says.
#pragma once

#include <tandem/base/errors.h>
#include <tandem/base/trace.h>
#include <tandem/checkpoint/checkpoint_manager.h>
#include <tandem/checkpoint/safetensors.h>
#include <tandem/collectives/communicator.h>
#include <tandem/collectives/compression.h>
#include <tandem/collectives/device_mesh.h>
#include <tandem/collectives/device_routing_communicator.h>
#include <tandem/collectives/gloo_communicator.h>
#include <tandem/collectives/grad_codec.h>
#include <tandem/collectives/nccl_communicator.h>
#include <tandem/runtime/activation_checkpoint.h>
#include <tandem/runtime/bucket_plan.h>
#include <tandem/runtime/config.h>
#include <tandem/runtime/config_keys.h>
#include <tandem/runtime/context.h>
#include <tandem/runtime/dist_env.h>
#include <tandem/runtime/distributed_data_parallel.h>
#include <tandem/runtime/fault_tolerance.h>
#include <tandem/runtime/grad_norm.h>
#include <tandem/runtime/grad_scaler.h>
#include <tandem/runtime/init.h>
#include <tandem/runtime/join.h>
#include <tandem/runtime/metrics.h>
#include <tandem/runtime/mixed_precision.h>
#include <tandem/runtime/pipeline_parallel.h>
#include <tandem/runtime/pipeline_schedule.h>
#include <tandem/runtime/pipeline_simulate.h>
#include <tandem/runtime/reducer.h>
#include <tandem/runtime/run_main.h>
#include <tandem/runtime/sharded_data_parallel.h>
#include <tandem/runtime/verify_replicas.h>
