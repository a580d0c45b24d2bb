cmake_minimum_required(VERSION 3.22)
# Runs the main job (02_train_gpt) short, with a periodic no-grad evaluation and a trace, and
# checks what a user sees: exit 0, loss falling, and nothing at all on standard error (no
# warning: the evaluation keeps its own prefetch trace; no garbled "zshard: zshard:" line).
# Usage: cmake -DEXE=... -DTRACE=... -P run_main_job.cmake
execute_process(
  COMMAND ${EXE} --steps 8 --eval-every 3 --log-every 4 --layers 2 --d-model 64 --d-ff 128 --seq 32 --batch 4
          --trace ${TRACE} --trace-step 3
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "02_train_gpt exited with ${rc}; stderr:\n${err}")
endif()
if(NOT err STREQUAL "")
  message(FATAL_ERROR "02_train_gpt wrote to standard error (expected nothing):\n${err}")
endif()
if(NOT out MATCHES "eval \\(no-grad pass\\) loss .*eval \\(no-grad pass\\) loss")
  message(FATAL_ERROR "expected two evaluations in the output")
endif()
if(NOT EXISTS ${TRACE})
  message(FATAL_ERROR "no trace written to ${TRACE}")
endif()
