# The static archives of gRPC, upb, protobuf, abseil, yaml-cpp and OpenSSL
# that Debian's -dev packages install beside the shared libraries. A
# program that starts often (the CLI, a Slurm job's ephemeral worker)
# links them in: a fresh process then maps a handful of shared objects
# instead of about 60, and the dynamic loader's work was most of its
# start-up (bench/RESULTS.md). Daemons that start once keep the shared
# libraries.
#
# dlbatch_find_static_deps(ARCHIVES MISSING): ARCHIVES, the archives to
# put in one --start-group/--end-group after the project's own; MISSING,
# those not installed (the caller then links everything shared).
function(dlbatch_find_static_deps archives_var missing_var)
  set(_archives)
  set(_missing)
  foreach(_lib grpc++ grpc gpr upb address_sorting re2 cares protobuf
               yaml-cpp ssl crypto)
    find_library(DLBATCH_STATIC_${_lib} NAMES lib${_lib}.a)
    if(DLBATCH_STATIC_${_lib})
      list(APPEND _archives ${DLBATCH_STATIC_${_lib}})
    else()
      list(APPEND _missing lib${_lib}.a)
    endif()
  endforeach()
  get_filename_component(_dir "${DLBATCH_STATIC_grpc}" DIRECTORY)
  file(GLOB _absl "${_dir}/libabsl_*.a")
  if(_absl)
    list(APPEND _archives ${_absl})
  else()
    list(APPEND _missing libabsl_*.a)
  endif()
  set(${archives_var} ${_archives} PARENT_SCOPE)
  set(${missing_var} ${_missing} PARENT_SCOPE)
endfunction()
