# zshard_plan --fit's outputs used as inputs: the DeepSpeed JSON it writes is read back by
# zshard_plan --deepspeed-config (and, for the main job's model, trains 02_train_gpt for a few
# steps), and the C++ it writes compiles.
# -DPLAN=zshard_plan -DDIR=<scratch> -DMODEL=llama3-70b|gpt-example [-DCXX=compiler -DINCLUDE=include dir]
# [-DMAIN_JOB=02_train_gpt] [-DARGS="extra;fit;args"]
file(MAKE_DIRECTORY ${DIR})
set(json ${DIR}/fit_${MODEL}.json)
set(cpp ${DIR}/fit_${MODEL}.cpp)
execute_process(COMMAND ${PLAN} --fit --model ${MODEL} ${ARGS} --write-deepspeed-config ${json} --write-cpp ${cpp}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0 OR NOT out MATCHES "fit_found: yes")
  message(FATAL_ERROR "zshard_plan --fit failed (${rc})")
endif()
if(MODEL STREQUAL "gpt-example")
  if(NOT out MATCHES "main job: 02_train_gpt --ranks ")
    message(FATAL_ERROR "no main job command line for the main job's model")
  endif()
else()
  # the written config, planned by zshard_plan from the file alone, fits the device
  execute_process(COMMAND ${PLAN} --deepspeed-config ${json} --model ${MODEL} ${PLAN_ARGS}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out2 ERROR_VARIABLE err2)
  message("${out2}${err2}")
  if(NOT rc EQUAL 0 OR NOT out2 MATCHES "fits: yes")
    message(FATAL_ERROR "the written DeepSpeed config does not plan as fitting")
  endif()
  if(err2 MATCHES "unknown key")
    message(FATAL_ERROR "the written DeepSpeed config has keys read_deepspeed_config does not know")
  endif()
endif()
if(MAIN_JOB)
  execute_process(COMMAND ${MAIN_JOB} --ranks 2 --steps 3 --eval-every 0 --deepspeed-config ${json}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out3 ERROR_VARIABLE err3)
  message("${out3}${err3}")
  if(NOT rc EQUAL 0 AND NOT rc EQUAL 1)  # 1: three steps may not lower the loss
    message(FATAL_ERROR "02_train_gpt refused the written DeepSpeed config (${rc})")
  endif()
endif()
if(CXX)
  execute_process(COMMAND ${CXX} -std=c++20 -fsyntax-only -I${INCLUDE} ${cpp} RESULT_VARIABLE rc ERROR_VARIABLE err4)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the written C++ does not compile:\n${err4}")
  endif()
endif()
