# The loom SDK for CMake: installed as PREFIX/lib/cmake/LoomSDK/LoomSDKConfig.cmake by
# loom's `bazel run //sdk:install -- PREFIX`.
#
#   find_package(LoomSDK REQUIRED)            # CMAKE_PREFIX_PATH or LoomSDK_DIR names PREFIX
#   loom_add_plugin(hello
#     SOURCES hello_plugin.cc
#     MANIFEST manifest.json)
#
# Provides
#   Loom::sdk              INTERFACE target: the SDK headers (+ nlohmann/json), C++20.
#   loom_add_plugin(...)   builds a plugin exactly as the Bazel macro loom_plugin does.
#   LOOM_SDK_VERSION, LOOM_SDK_INCLUDE_DIR, LOOM_SDK_PLUGIN_LDS
#
# Relocatable: every path is found from this file's location.

if(CMAKE_VERSION VERSION_LESS 3.16)
  message(FATAL_ERROR "LoomSDK needs CMake 3.16 or newer (this is ${CMAKE_VERSION})")
endif()

get_filename_component(_loom_sdk_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
set(LOOM_SDK_INCLUDE_DIR "${_loom_sdk_prefix}/include")
set(LOOM_SDK_PLUGIN_LDS "${_loom_sdk_prefix}/share/loom/plugin.lds")
set(LOOM_SDK_VERSION "${LoomSDK_VERSION}")
unset(_loom_sdk_prefix)

foreach(_loom_file "${LOOM_SDK_INCLUDE_DIR}/loom/sdk.h" "${LOOM_SDK_PLUGIN_LDS}")
  if(NOT EXISTS "${_loom_file}")
    set(LoomSDK_FOUND FALSE)
    set(LoomSDK_NOT_FOUND_MESSAGE
        "the loom SDK at ${CMAKE_CURRENT_LIST_DIR} is incomplete: ${_loom_file} is missing; "
        "reinstall it with `bazel run //sdk:install -- PREFIX` in the loom repository")
    return()
  endif()
endforeach()
unset(_loom_file)

if(NOT TARGET Loom::sdk)
  add_library(Loom::sdk INTERFACE IMPORTED)
  set_target_properties(Loom::sdk PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${LOOM_SDK_INCLUDE_DIR}"
    INTERFACE_COMPILE_FEATURES cxx_std_20)
  # nlohmann/json: its CMake package when there is one, else the system include path.
  find_package(nlohmann_json 3 QUIET)
  if(TARGET nlohmann_json::nlohmann_json)
    set_property(TARGET Loom::sdk APPEND PROPERTY
      INTERFACE_LINK_LIBRARIES nlohmann_json::nlohmann_json)
  else()
    find_path(LOOM_SDK_NLOHMANN_JSON_INCLUDE_DIR nlohmann/json.hpp)
    if(NOT LOOM_SDK_NLOHMANN_JSON_INCLUDE_DIR)
      set(LoomSDK_FOUND FALSE)
      set(LoomSDK_NOT_FOUND_MESSAGE
          "the loom SDK needs nlohmann/json (nlohmann/json.hpp not found); install it "
          "(Debian: apt-get install nlohmann-json3-dev) or set "
          "LOOM_SDK_NLOHMANN_JSON_INCLUDE_DIR")
      return()
    endif()
    set_property(TARGET Loom::sdk APPEND PROPERTY
      INTERFACE_INCLUDE_DIRECTORIES "${LOOM_SDK_NLOHMANN_JSON_INCLUDE_DIR}")
  endif()
endif()

# loom_add_plugin(NAME SOURCES src... [MANIFEST file] [LINK_LIBRARIES lib...])
#
# Builds the loom plugin NAME as the Bazel macro loom_plugin (sdk/defs.bzl) does, into the
# plugin directory ${CMAKE_CURRENT_BINARY_DIR}/NAME/:
#   libloom_NAME.so  a MODULE library (CMake target NAME) compiled with -std=c++20
#                    -fvisibility=hidden -fvisibility-inlines-hidden and linked with the
#                    SDK's version script (exports only loom_plugin_v1),
#                    -Wl,--exclude-libs,ALL and -Wl,-z,defs;
#   plugin.json      a verbatim copy of the manifest.
# The manifest's exact text is also embedded into the library (loom_embedded_manifest(),
# generated into ${CMAKE_CURRENT_BINARY_DIR}/NAME_manifest.cc). Both copies are refreshed
# when the manifest changes (CMake reconfigures).
#
#   SOURCES         the plugin's C++ sources (one of them uses LOOM_PLUGIN(MainClass))
#   MANIFEST        its manifest, relative to the current source dir; default manifest.json
#   LINK_LIBRARIES  further libraries linked PRIVATE (e.g. fmt::fmt); their symbols stay
#                   local to the plugin
function(loom_add_plugin name)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "" "MANIFEST" "SOURCES;LINK_LIBRARIES")
  if(ARG_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "loom_add_plugin(${name}): unexpected arguments "
                        "'${ARG_UNPARSED_ARGUMENTS}'; expected SOURCES, MANIFEST, LINK_LIBRARIES")
  endif()
  if(NOT name MATCHES "^[a-z0-9_.-]+$")
    message(FATAL_ERROR "loom_add_plugin(${name}): a plugin name is [a-z0-9_.-]+")
  endif()
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "loom_add_plugin(${name}): no SOURCES given")
  endif()
  if(NOT ARG_MANIFEST)
    set(ARG_MANIFEST manifest.json)
  endif()
  get_filename_component(manifest "${ARG_MANIFEST}" ABSOLUTE
                         BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
  if(NOT EXISTS "${manifest}")
    message(FATAL_ERROR "loom_add_plugin(${name}): manifest ${manifest} not found")
  endif()

  set(plugin_dir "${CMAKE_CURRENT_BINARY_DIR}/${name}")
  set(manifest_cc "${CMAKE_CURRENT_BINARY_DIR}/${name}_manifest.cc")

  # The sidecar; configure_file also makes CMake reconfigure when the manifest changes.
  configure_file("${manifest}" "${plugin_dir}/plugin.json" COPYONLY)

  # The embedded copy: the manifest's exact bytes in a raw string literal. Written through
  # a temporary + configure_file(COPYONLY) so the .cc is touched only when it changes.
  file(READ "${manifest}" text)
  set(terminator ")loom_manifest\"")
  string(FIND "${text}" "${terminator}" found)
  if(NOT found EQUAL -1)
    message(FATAL_ERROR "loom_add_plugin(${name}): ${manifest} contains ${terminator}, "
                        "which ends the raw string that embeds it; remove that text")
  endif()
  file(WRITE "${manifest_cc}.tmp"
       "// Generated by loom_add_plugin(${name}) from the manifest: its exact text. Do not edit.\n"
       "extern \"C\" const char* loom_embedded_manifest() { return R\"loom_manifest(${text}"
       "${terminator}; }\n")
  configure_file("${manifest_cc}.tmp" "${manifest_cc}" COPYONLY)
  file(REMOVE "${manifest_cc}.tmp")

  add_library(${name} MODULE ${ARG_SOURCES} "${manifest_cc}")
  target_link_libraries(${name} PRIVATE Loom::sdk ${ARG_LINK_LIBRARIES})
  target_compile_options(${name} PRIVATE -fvisibility=hidden -fvisibility-inlines-hidden)
  target_link_options(${name} PRIVATE
    "-Wl,--version-script=${LOOM_SDK_PLUGIN_LDS}" "-Wl,--exclude-libs,ALL" "-Wl,-z,defs")
  set_target_properties(${name} PROPERTIES
    DEFINE_SYMBOL ""  # no NAME_EXPORTS define: LOOM_PLUGIN marks the one export
    PREFIX "lib"
    OUTPUT_NAME "loom_${name}"
    SUFFIX ".so"
    # A generator expression keeps multi-config generators from adding a config subdir.
    LIBRARY_OUTPUT_DIRECTORY "$<1:${plugin_dir}>"
    CXX_STANDARD 20
    CXX_STANDARD_REQUIRED ON
    CXX_EXTENSIONS OFF
    POSITION_INDEPENDENT_CODE ON
    LINK_DEPENDS "${LOOM_SDK_PLUGIN_LDS}")
endfunction()
