# xgrammar's C++ core (the grammar engine of constrained decoding, src/constrain), built from its
# pinned PyPI sdist. The repository does not carry xgrammar's code: configure fetches the sdist into
# CEDAR_DEPS_CACHE (default third_party/, git-ignored), checks its sha256, unpacks it, and this file
# compiles only the core's sources (cpp/*.cc without the Python/TVM-FFI bindings; no cpptrace) into
# the static library cedar_xgrammar.
#
# Offline builds: put the sdist at ${CEDAR_DEPS_CACHE}/xgrammar-0.2.9.tar.gz (same sha256) first.
set(CEDAR_XGRAMMAR_VERSION 0.2.9)
set(CEDAR_XGRAMMAR_SHA256 87b466bca2475e29bb0323abc62c6c33cbcbcff47e5fb800a3e2099ac9620b90)
set(CEDAR_XGRAMMAR_URL
  "https://files.pythonhosted.org/packages/3a/2f/5bf8e8fa6619cff534932f79b0abc81a417d354bc5093252c1a6081d0a93/xgrammar-${CEDAR_XGRAMMAR_VERSION}.tar.gz")
set(CEDAR_DEPS_CACHE "${PROJECT_SOURCE_DIR}/third_party" CACHE PATH
  "Where pinned third-party sources (the xgrammar sdist) are downloaded and unpacked")

set(_xg_tarball "${CEDAR_DEPS_CACHE}/xgrammar-${CEDAR_XGRAMMAR_VERSION}.tar.gz")
set(_xg_root "${CEDAR_DEPS_CACHE}/xgrammar-${CEDAR_XGRAMMAR_VERSION}")
# The stamp names the local fixes too (below), so a tree unpacked before a fix is unpacked again.
set(_xg_stamp "${_xg_root}/.cedar-unpacked-${CEDAR_XGRAMMAR_SHA256}-fix1")

if(NOT EXISTS "${_xg_stamp}")
  file(MAKE_DIRECTORY "${CEDAR_DEPS_CACHE}")
  set(_xg_have_tarball FALSE)
  if(EXISTS "${_xg_tarball}")
    file(SHA256 "${_xg_tarball}" _xg_sum)
    if(_xg_sum STREQUAL CEDAR_XGRAMMAR_SHA256)
      set(_xg_have_tarball TRUE)
    else()
      message(STATUS "xgrammar: ${_xg_tarball} has sha256 ${_xg_sum}, not the pinned one; fetching again")
      file(REMOVE "${_xg_tarball}")
    endif()
  endif()
  if(NOT _xg_have_tarball)
    message(STATUS "xgrammar: downloading the pinned sdist ${CEDAR_XGRAMMAR_VERSION} from PyPI")
    file(DOWNLOAD "${CEDAR_XGRAMMAR_URL}" "${_xg_tarball}.part" STATUS _xg_status TLS_VERIFY ON)
    list(GET _xg_status 0 _xg_code)
    if(_xg_code EQUAL 0)
      file(SHA256 "${_xg_tarball}.part" _xg_sum)
    endif()
    if(NOT _xg_code EQUAL 0 OR NOT _xg_sum STREQUAL CEDAR_XGRAMMAR_SHA256)
      file(REMOVE "${_xg_tarball}.part")
      message(FATAL_ERROR
        "xgrammar ${CEDAR_XGRAMMAR_VERSION} (cedar's grammar engine for constrained decoding) is missing.\n"
        "Download failed (${_xg_status}) or the sha256 differs from ${CEDAR_XGRAMMAR_SHA256}.\n"
        "Fix: give this machine access to files.pythonhosted.org, or download\n"
        "  ${CEDAR_XGRAMMAR_URL}\n"
        "elsewhere, check its sha256, and put it at ${_xg_tarball}, then configure again.")
    endif()
    file(RENAME "${_xg_tarball}.part" "${_xg_tarball}")
  endif()
  file(REMOVE_RECURSE "${_xg_root}")
  file(ARCHIVE_EXTRACT INPUT "${_xg_tarball}" DESTINATION "${CEDAR_DEPS_CACHE}")
  if(NOT EXISTS "${_xg_root}/include/xgrammar/xgrammar.h")
    message(FATAL_ERROR "xgrammar: ${_xg_tarball} did not unpack into ${_xg_root}")
  endif()
  # Local fix 1: a JSON string with minLength/maxLength lets through raw control characters
  # (U+0000-U+001F other than \r and \n), which JSON forbids inside strings; 0.2.9's unbounded
  # strings exclude them already. Found by tests/serve/constrained/sample_test.py (a tab inside a
  # maxLength string); checked by tests/constrain's JsonSchemaWalks.
  set(_xg_conv "${_xg_root}/cpp/json_schema_converter.cc")
  file(READ "${_xg_conv}" _xg_text)
  set(_xg_from "builder_.AddCharacterClass({{'\"', '\"'}, {'\\\\', '\\\\'}, {'\\r', '\\r'}, {'\\n', '\\n'}}, true);")
  set(_xg_to "builder_.AddCharacterClass({{0, 0x1f}, {'\"', '\"'}, {'\\\\', '\\\\'}}, true);")
  string(FIND "${_xg_text}" "${_xg_from}" _xg_at)
  if(_xg_at EQUAL -1)
    message(FATAL_ERROR "xgrammar: the bounded-string character class to fix was not found in ${_xg_conv}")
  endif()
  string(REPLACE "${_xg_from}" "${_xg_to}" _xg_text "${_xg_text}")
  file(WRITE "${_xg_conv}" "${_xg_text}")
  file(TOUCH "${_xg_stamp}")
endif()

# The core only: every cpp/**/*.cc except the TVM-FFI / nanobind bindings of the Python package.
file(GLOB_RECURSE _xg_sources "${_xg_root}/cpp/*.cc")
list(FILTER _xg_sources EXCLUDE REGEX "/cpp/(tvm_ffi|nanobind)/")
add_library(cedar_xgrammar STATIC ${_xg_sources})
target_compile_features(cedar_xgrammar PUBLIC cxx_std_17)
target_include_directories(cedar_xgrammar SYSTEM PUBLIC
  "${_xg_root}/include" "${_xg_root}/3rdparty/dlpack/include" "${_xg_root}/3rdparty/picojson")
target_compile_definitions(cedar_xgrammar PUBLIC
  XGRAMMAR_ENABLE_CPPTRACE=0 XGRAMMAR_ENABLE_INTERNAL_CHECK=0)
# Third-party code: its own warnings are not cedar's to fix.
target_compile_options(cedar_xgrammar PRIVATE -w)
set_target_properties(cedar_xgrammar PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_link_libraries(cedar_xgrammar PUBLIC Threads::Threads)
