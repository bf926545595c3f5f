# Third-party dependencies, all from Debian -dev packages (scripts/deps.sh installs them).
find_package(Threads REQUIRED)
find_package(hwy REQUIRED)                 # libhwy-dev: portable SIMD with runtime dispatch
find_package(nlohmann_json 3.10 REQUIRED)  # nlohmann-json3-dev
find_package(PkgConfig REQUIRED)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET libzstd)
pkg_check_modules(HIREDIS REQUIRED IMPORTED_TARGET hiredis)  # libhiredis-dev: the shared KV tier (kv/redis_tier.h)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(URING REQUIRED IMPORTED_TARGET liburing)  # liburing-dev: streaming reads
find_path(HTTPLIB_INCLUDE_DIR httplib.h REQUIRED)  # libcpp-httplib-dev (header + shared lib)
find_library(HTTPLIB_LIBRARY cpp-httplib)
if(CEDAR_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(CEDAR_BUILD_BENCH)
  find_package(benchmark REQUIRED)
endif()
add_library(cedar_httplib INTERFACE)
target_include_directories(cedar_httplib INTERFACE ${HTTPLIB_INCLUDE_DIR})
if(HTTPLIB_LIBRARY)
  target_link_libraries(cedar_httplib INTERFACE ${HTTPLIB_LIBRARY})
endif()
