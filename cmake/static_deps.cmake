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

# dlbatch_link_static_deps(TARGET WHAT LINKED OWN_ARCHIVE...): where every
# archive above is installed, links them into TARGET after its project
# archives OWN_ARCHIVE... and sets LINKED to TRUE; else leaves TARGET on the
# shared libraries and sets LINKED to FALSE. WHAT names TARGET in the
# configure messages ("the CLI").
function(dlbatch_link_static_deps target what linked_var)
  dlbatch_find_static_deps(_archives _missing)
  if(_missing)
    message(STATUS "dlbatch: ${what} links gRPC and protobuf as shared "
      "libraries (no ${_missing})")
    set(${linked_var} FALSE PARENT_SCOPE)
    return()
  endif()
  # The project's own archives first, so that every symbol they need is
  # taken from the archives in the group; --as-needed then leaves out the
  # shared copies that TARGET's other dependencies name.
  target_link_libraries(${target} PRIVATE ${ARGN}
    -Wl,--start-group ${_archives} -Wl,--end-group -Wl,--as-needed)
  message(STATUS "dlbatch: ${what} links gRPC, protobuf, abseil, "
    "yaml-cpp and OpenSSL statically")
  set(${linked_var} TRUE PARENT_SCOPE)
endfunction()
