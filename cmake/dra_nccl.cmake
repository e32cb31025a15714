# Locate CUDA runtime + NCCL headers/libraries for the NCCL backend.
# Sources, in order: NCCL_ROOT / CUDA toolkit on the machine, then the NVIDIA wheels on PyPI
# (nvidia-nccl-cu13, nvidia-cuda-runtime) found through the Python interpreter.
# Sets DRA_HAVE_NCCL and an INTERFACE target dra_nccl_deps.
set(DRA_HAVE_NCCL OFF)
if(DRA_WITH_NCCL STREQUAL "OFF")
  return()
endif()
set(_dra_nccl_hints "")
if(DEFINED ENV{NCCL_ROOT})
  list(APPEND _dra_nccl_hints "$ENV{NCCL_ROOT}")
endif()
find_program(_dra_py NAMES python3 python)
if(_dra_py)
  execute_process(COMMAND "${_dra_py}" -c
    "import nvidia, os; print(';'.join(os.path.join(p, sub) for p in nvidia.__path__ for sub in ('nccl', 'cu13', 'cuda_runtime')))"
    OUTPUT_VARIABLE _dra_wheel_dirs OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  list(APPEND _dra_nccl_hints ${_dra_wheel_dirs})
endif()
find_path(DRA_NCCL_INCLUDE_DIR nccl.h HINTS ${_dra_nccl_hints} PATH_SUFFIXES include)
find_library(DRA_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_dra_nccl_hints} PATH_SUFFIXES lib lib64)
find_path(DRA_CUDART_INCLUDE_DIR cuda_runtime_api.h HINTS ${_dra_nccl_hints} /usr/local/cuda PATH_SUFFIXES include)
find_library(DRA_CUDART_LIBRARY NAMES cudart libcudart.so.13 libcudart.so.12 HINTS ${_dra_nccl_hints} /usr/local/cuda PATH_SUFFIXES lib lib64)
if(DRA_NCCL_INCLUDE_DIR AND DRA_NCCL_LIBRARY AND DRA_CUDART_INCLUDE_DIR AND DRA_CUDART_LIBRARY)
  set(DRA_HAVE_NCCL ON)
  add_library(dra_nccl_deps INTERFACE)
  target_include_directories(dra_nccl_deps INTERFACE ${DRA_NCCL_INCLUDE_DIR} ${DRA_CUDART_INCLUDE_DIR})
  target_link_libraries(dra_nccl_deps INTERFACE ${DRA_NCCL_LIBRARY} ${DRA_CUDART_LIBRARY})
  message(STATUS "dra: NCCL backend ON (nccl.h in ${DRA_NCCL_INCLUDE_DIR}, ${DRA_NCCL_LIBRARY})")
elseif(DRA_WITH_NCCL STREQUAL "ON")
  message(FATAL_ERROR "dra: DRA_WITH_NCCL=ON but NCCL/CUDA were not found "
    "(nccl.h='${DRA_NCCL_INCLUDE_DIR}', libnccl='${DRA_NCCL_LIBRARY}', cudart='${DRA_CUDART_LIBRARY}'). "
    "Set NCCL_ROOT, or pip install nvidia-nccl-cu13 nvidia-cuda-runtime, or pass -DDRA_WITH_NCCL=OFF.")
else()
  message(STATUS "dra: NCCL backend OFF (NCCL or CUDA runtime not found; set NCCL_ROOT or pip install nvidia-nccl-cu13)")
endif()
