"""cuda_library: CUDA sources compiled by nvcc, linked like any other cc_library.

Bazel's C++ rules do not know nvcc, so each `.cu` file is compiled by a small rule into an
object file (in one configuration for every build: see _cuda_hop1), and a `cc_library` of the
same name wraps those objects. Everything else (tests,
`cc_binary(linkshared = True)` plugins) depends on that `cc_library` as usual.

    load("//tools/bazel:cuda.bzl", "cuda_library")

    cuda_library(
        name = "gemm",
        srcs = ["gemm.cu", "tile.cuh"],
        hdrs = ["gemm.h"],
        deps = ["//sdk:kernel_api"],
    )
"""

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")

# SASS for Hopper, both the portable sm_90 and the arch-specific sm_90a (wgmma, setmaxnreg),
# plus compute_89 PTX: SASS loads only on compute capability 9.x, so the PTX is what lets
# other GPUs JIT the kernels instead of failing to load them: newer ones, and Ada (sm_89,
# the oldest with FP8 tensor cores: L4, L40S), which PTX of compute_90 would not serve.
# Code for sm_90 only (16-byte vector atomics) is guarded by __CUDA_ARCH__.
_GENCODE = [
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90a,code=sm_90a",
    "-gencode=arch=compute_89,code=compute_89",
]

# -fPIC always: one object serves static test binaries and shared-object plugins alike, so
# the objects are plain `.o` files that cc_library uses for both PIC and non-PIC links.
_NVCC_FLAGS = ["-std=c++20", "-O3", "-Xcompiler=-fPIC"] + _GENCODE

def _nvcc_objects_impl(ctx):
    cc_toolchain = find_cpp_toolchain(ctx)
    contexts = [dep[CcInfo].compilation_context for dep in ctx.attr.deps]

    # The roots that cc_library compiles see, so that a .cu file includes its own package's
    # headers by their workspace path ("kernels/cuda/x/y.h") just as a .cc file does.
    root = ctx.label.workspace_root
    own_includes = [root or ".", ctx.bin_dir.path + ("/" + root if root else "")]

    # nvcc has no -iquote; quote includes become -I, which only widens where <...> looks.
    includes = depset(
        own_includes,
        transitive = [c.quote_includes for c in contexts] + [c.includes for c in contexts],
    )
    system_includes = depset(transitive = [c.system_includes for c in contexts])
    defines = depset(transitive = [c.defines for c in contexts])
    headers = depset(
        ctx.files.hdrs + [f for f in ctx.files.srcs if f.extension != "cu"],
        transitive = [c.headers for c in contexts],
    )

    objects = []
    stems = {}
    for src in ctx.files.srcs:
        if src.extension != "cu":
            continue
        stem = src.basename[:-len(".cu")]
        if stem in stems:
            fail("cuda_library '{}': two sources named {}.cu".format(ctx.label.name, stem))
        stems[stem] = True
        obj = ctx.actions.declare_file("_objs/{}/{}.o".format(ctx.label.name, stem))

        args = ctx.actions.args()
        args.add_all(_NVCC_FLAGS)
        # The C++ toolchain's compiler, so host code is built by the same g++ as the rest.
        args.add("-ccbin", cc_toolchain.compiler_executable)
        args.add_all(ctx.attr.copts)
        args.add_all(defines, format_each = "-D%s")
        args.add_all(includes, format_each = "-I%s")
        args.add_all(system_includes, before_each = "-isystem")
        args.add("-c", src)
        args.add("-o", obj)

        # nvcc finds cicc, ptxas and its headers relative to the path it was started by; in
        # the sandbox that is a lone symlink, so start it by its real path in the toolkit.
        ctx.actions.run_shell(
            command = 'nvcc="$(readlink -f "$1")" && shift && exec "$nvcc" "$@"',
            arguments = [ctx.executable._nvcc.path, args],
            tools = [ctx.executable._nvcc],
            inputs = depset([src], transitive = [headers]),
            outputs = [obj],
            # PATH (passed by --action_env) lets nvcc find its own tools and the host g++.
            use_default_shell_env = True,
            mnemonic = "NvccCompile",
            progress_message = "Compiling CUDA {}".format(src.short_path),
        )
        objects.append(obj)

    return [DefaultInfo(files = depset(objects))]

# nvcc's command line does not depend on the build's configuration (_NVCC_FLAGS, not --copt or
# --compilation_mode), yet each configuration has its own output folder, so the default, the
# sanitizer and the opt passes of `tools/loom test` would each compile every .cu file again:
# the slowest part of a cold run. The objects are therefore built in one configuration,
# whatever the build's: compilation mode opt and no --copt. Bazel names a transitioned
# configuration's folder by a hash of the options that transitions changed, so the mode must
# be changed in every pass, opt's included: the first hop (into _cuda_objects) moves it off
# its value, the second (into _nvcc_objects) sets it to opt. Every pass then has the same
# folder and command lines, and the second and third passes find the objects in the disk
# cache.
def _cuda_hop1_impl(settings, attr):
    mode = settings["//command_line_option:compilation_mode"]
    return {"//command_line_option:compilation_mode": "fastbuild" if mode != "fastbuild" else "dbg"}

_cuda_hop1 = transition(
    implementation = _cuda_hop1_impl,
    inputs = ["//command_line_option:compilation_mode"],
    outputs = ["//command_line_option:compilation_mode"],
)

def _cuda_hop2_impl(settings, attr):
    return {
        "//command_line_option:compilation_mode": "opt",
        "//command_line_option:copt": [],
    }

_cuda_hop2 = transition(
    implementation = _cuda_hop2_impl,
    inputs = [],
    outputs = [
        "//command_line_option:compilation_mode",
        "//command_line_option:copt",
    ],
)

def _cuda_objects_impl(ctx):
    return [DefaultInfo(files = ctx.attr.objects[0][DefaultInfo].files)]

_cuda_objects = rule(
    implementation = _cuda_objects_impl,
    doc = "The objects of an _nvcc_objects target, built in the one configuration above.",
    cfg = _cuda_hop1,
    attrs = {
        "objects": attr.label(cfg = _cuda_hop2, mandatory = True),
        "_allowlist_function_transition": attr.label(
            default = "@bazel_tools//tools/allowlists/function_transition_allowlist",
        ),
    },
)

_nvcc_objects = rule(
    implementation = _nvcc_objects_impl,
    doc = "Compiles each .cu source with nvcc into one PIC object file (see cuda_library).",
    attrs = {
        "srcs": attr.label_list(
            allow_files = [".cu", ".cuh"],
            doc = ".cu files, each compiled to one object; .cuh files are private headers " +
                  "that the .cu files may include.",
        ),
        "hdrs": attr.label_list(
            allow_files = True,
            doc = "Public headers of the library, visible to its .cu files.",
        ),
        "deps": attr.label_list(
            providers = [CcInfo],
            doc = "C++ libraries whose headers, include paths and defines the .cu files use.",
        ),
        "copts": attr.string_list(
            doc = "Extra nvcc flags, after the defaults (pass host flags as -Xcompiler=...).",
        ),
        "_nvcc": attr.label(
            default = Label("@cuda//:bin/nvcc"),
            executable = True,
            allow_single_file = True,
            cfg = "exec",
        ),
        "_cc_toolchain": attr.label(
            default = Label("@bazel_tools//tools/cpp:current_cc_toolchain"),
        ),
    },
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
)

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], visibility = None, **kwargs):
    """A cc_library whose sources are CUDA, compiled by nvcc for sm_90, sm_90a and compute_90.

    Args:
      name: name of the resulting cc_library; the nvcc objects are `<name>_nvcc_objects`,
        reached through `<name>_cuda_objects` (the configuration hops above).
      srcs: `.cu` files, one object each, and private `.cuh` headers they include.
      hdrs: public headers, exported by the cc_library. Keep them plain C++ (no CUDA types)
        so that .cc code and plugins can include them without nvcc.
      deps: cc_library dependencies; their headers, include paths and defines reach the .cu
        files, and they are linked with the objects. The static CUDA runtime is added.
      copts: extra nvcc flags for every .cu file.
      visibility: visibility of the cc_library.
      **kwargs: passed to the cc_library (e.g. alwayslink); `tags` and `testonly` go to
        the two inner targets too, which are also tagged `manual`. The cc_library is always
        `linkstatic`.
    """
    # "manual": out of `//...` and every other wildcard. A wildcard would make the two inner
    # targets top-level targets of the build, built in the build's own configuration as well
    # as in the shared one below the hops: every .cu file compiled once more per pass of
    # `tools/loom test`. Reached through the cc_library they are built in the shared one only.
    inner_tags = (kwargs.get("tags") or []) + ["manual"]
    _nvcc_objects(
        name = name + "_nvcc_objects",
        srcs = srcs,
        hdrs = hdrs,
        deps = deps,
        copts = copts,
        visibility = ["//visibility:private"],
        tags = inner_tags,
        testonly = kwargs.get("testonly"),
    )
    _cuda_objects(
        name = name + "_cuda_objects",
        objects = ":" + name + "_nvcc_objects",
        visibility = ["//visibility:private"],
        tags = inner_tags,
        testonly = kwargs.get("testonly"),
    )
    native.cc_library(
        name = name,
        srcs = [":" + name + "_cuda_objects"],
        hdrs = hdrs,
        deps = deps + ["@cuda//:cudart"],
        # No lib<name>.so for dynamically linked tests: the static CUDA runtime is linked
        # only into the final binary or plugin, so the objects must land there with it.
        linkstatic = True,
        visibility = visibility,
        **kwargs
    )
