# NCCL backend: headers only. dra loads libnccl at run time (dlopen, src/comm/nccl/nccl_api_dl.cpp), so
# neither libnccl nor libcudart is a link-time dependency: the build needs nccl.h and the CUDA
# headers it includes (cuda_runtime.h, cuda_fp16.h, ...), nothing else.
# Where they are looked for, in order: NCCL_ROOT / CUDA_HOME (environment), the CUDA toolkit at
# /usr/local/cuda, and the NVIDIA wheels (nvidia-nccl-cu13; nvidia-cuda-runtime or the cu13
# bundle) found through the Python interpreter's `nvidia` namespace package.
# DRA_WITH_NCCL: ON (fail when not found), OFF (never), AUTO (default: on when found).
# Sets DRA_HAVE_NCCL and, when on, an INTERFACE target dra_nccl_deps (include dirs, the build-time
# libnccl location as a last-resort dlopen candidate, libdl).
set(DRA_HAVE_NCCL OFF)
if(DRA_WITH_NCCL STREQUAL "OFF")
  message(STATUS "dra: NCCL backend OFF (DRA_WITH_NCCL=OFF)")
  return()
endif()
set(_dra_nccl_hints "")
foreach(_dra_env NCCL_ROOT NCCL_HOME CUDA_HOME CUDA_PATH)
  if(DEFINED ENV{${_dra_env}})
    list(APPEND _dra_nccl_hints "$ENV{${_dra_env}}")
  endif()
endforeach()
set(_dra_py "${Python_EXECUTABLE}")
if(NOT _dra_py)
  find_program(_dra_py NAMES python3 python)
endif()
if(_dra_py)
  execute_process(COMMAND "${_dra_py}" -c
    "import nvidia, os; print(';'.join(os.path.join(p, sub) for p in nvidia.__path__ for sub in ('nccl', 'cu13', 'cu12', 'cuda_runtime')))"
    OUTPUT_VARIABLE _dra_wheel_dirs OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  list(APPEND _dra_nccl_hints ${_dra_wheel_dirs})
endif()
list(APPEND _dra_nccl_hints /usr/local/cuda)
find_path(DRA_NCCL_INCLUDE_DIR nccl.h HINTS ${_dra_nccl_hints} PATH_SUFFIXES include)
find_path(DRA_CUDART_INCLUDE_DIR cuda_runtime_api.h HINTS ${_dra_nccl_hints} PATH_SUFFIXES include)
# Optional: only remembered as the last dlopen candidate (after DRA_NCCL_LIBRARY and the loader path).
find_library(DRA_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_dra_nccl_hints} PATH_SUFFIXES lib lib64)

set(_dra_nccl_header_version "")
if(DRA_NCCL_INCLUDE_DIR)
  file(STRINGS "${DRA_NCCL_INCLUDE_DIR}/nccl.h" _dra_nccl_code REGEX "^#define NCCL_VERSION_CODE [0-9]+")
  string(REGEX REPLACE "^#define NCCL_VERSION_CODE ([0-9]+).*" "\\1" _dra_nccl_header_version "${_dra_nccl_code}")
endif()

if(DRA_NCCL_INCLUDE_DIR AND DRA_CUDART_INCLUDE_DIR AND _dra_nccl_header_version GREATER_EQUAL 21400)
  set(DRA_HAVE_NCCL ON)
  add_library(dra_nccl_deps INTERFACE)
  target_include_directories(dra_nccl_deps INTERFACE ${DRA_NCCL_INCLUDE_DIR} ${DRA_CUDART_INCLUDE_DIR})
  target_link_libraries(dra_nccl_deps INTERFACE ${CMAKE_DL_LIBS})
  if(DRA_NCCL_LIBRARY)
    # Only the loader reads the hint (an absolute path): set on its source alone, so a moved venv
    # recompiles one file, not the whole library.
    set_source_files_properties(${PROJECT_SOURCE_DIR}/src/comm/nccl/nccl_api_dl.cpp
      PROPERTIES COMPILE_DEFINITIONS DRA_NCCL_LIBRARY_HINT="${DRA_NCCL_LIBRARY}")
  endif()
  message(STATUS "dra: NCCL backend ON (nccl.h ${_dra_nccl_header_version} in ${DRA_NCCL_INCLUDE_DIR}; "
    "CUDA headers in ${DRA_CUDART_INCLUDE_DIR}; libnccl loaded at run time)")
elseif(DRA_WITH_NCCL STREQUAL "ON")
  message(FATAL_ERROR "dra: DRA_WITH_NCCL=ON but the NCCL backend's headers were not found "
    "(nccl.h='${DRA_NCCL_INCLUDE_DIR}' version '${_dra_nccl_header_version}' (needs >= 2.14), "
    "cuda_runtime_api.h='${DRA_CUDART_INCLUDE_DIR}'). "
    "Set NCCL_ROOT / CUDA_HOME, or pip install nvidia-nccl-cu13 (and the CUDA toolkit or nvidia-cuda-runtime), "
    "or pass -DDRA_WITH_NCCL=OFF.")
else()
  message(STATUS "dra: NCCL backend OFF (nccl.h >= 2.14 and CUDA headers not both found; "
    "pip install nvidia-nccl-cu13 or set NCCL_ROOT)")
endif()
