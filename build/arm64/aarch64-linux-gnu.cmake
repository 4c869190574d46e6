# CMake toolchain file: build for 64-bit ARM Linux (Jetson Orin, any aarch64 board) on an x86_64 host
# with Debian's cross compilers (`apt-get install crossbuild-essential-arm64`).
#
#   cmake -DCMAKE_TOOLCHAIN_FILE=build/arm64/aarch64-linux-gnu.cmake ...
#
# Libraries and headers come from the cross sysroot (/usr/aarch64-linux-gnu: glibc, libstdc++, libgomp),
# never from the x86 host; programs (cmake, ninja, python) run on the host. CPU features are not set
# here: ggml chooses them from GGML_CPU_ARM_ARCH (build/arm64/llama_wheel.sh passes the Jetson's).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(CROSS_TRIPLE aarch64-linux-gnu)
set(CMAKE_C_COMPILER ${CROSS_TRIPLE}-gcc)
set(CMAKE_CXX_COMPILER ${CROSS_TRIPLE}-g++)
set(CMAKE_AR ${CROSS_TRIPLE}-ar CACHE FILEPATH "archiver")
set(CMAKE_RANLIB ${CROSS_TRIPLE}-ranlib CACHE FILEPATH "ranlib")
set(CMAKE_STRIP ${CROSS_TRIPLE}-strip CACHE FILEPATH "strip")

set(CMAKE_FIND_ROOT_PATH /usr/${CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# Tuning only (no instruction beyond -march): schedule for the Jetson Orin's Cortex-A78AE cores.
set(CMAKE_C_FLAGS_INIT "-mtune=cortex-a78ae")
set(CMAKE_CXX_FLAGS_INIT "-mtune=cortex-a78ae")
