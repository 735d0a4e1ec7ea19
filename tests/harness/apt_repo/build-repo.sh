#!/usr/bin/env bash
# Build the simulated NVIDIA apt repository used by the container tests.
#
# Usage: build-repo.sh OUTPUT_DIR
#
# The test containers have no network, so NVIDIA's apt repository is replaced by a local flat
# repository of tiny .debs that carry NVIDIA's real package names, versions and dependency
# structure (see README.md and packages.spec). Containers use it as
#     deb [trusted=yes] file:///srv/nvidia-apt ./
#
# The build is reproducible (fixed timestamps, sorted index, no build dates) and idempotent: a stamp
# holding the hash of every input (this script, packages.spec, the mock NVML sources) is written
# into OUTPUT_DIR, and a run whose inputs match the stamp rebuilds nothing.
set -euo pipefail
umask 022 # apt reads file: repositories as the unprivileged _apt user

SCRIPT_PATH=$(readlink -f "${BASH_SOURCE[0]}")
HERE=$(dirname "$SCRIPT_PATH")
REPO_ROOT=$(cd "$HERE/../../.." && pwd)
SPEC=$HERE/packages.spec
# The driver packages ship the mock NVML library and tools built from this directory. Overridable
# only so a copy of this script (its own unit tests) or a stand-in mock can be used; the fleet
# uses the default.
MOCK_NVML_DIR=${MOCK_NVML_DIR:-$REPO_ROOT/tests/harness/mock_nvml}
CC=${CC:-cc}

MAINTAINER='Project test harness <harness@invalid>'
STAMP_NAME=.build-stamp
# Every file mtime, ar header and the Release date derive from this, so two builds of the same
# inputs are byte-identical (dpkg-deb also clamps to it).
export SOURCE_DATE_EPOCH=1700000000
export LC_ALL=C

die() {
    echo "build-repo: error: $*" >&2
    exit 1
}

# ---------------------------------------------------------------------------------------------------
# Host architecture and the paths NVIDIA's packages use on it.

ARCH=$(dpkg --print-architecture)
case $ARCH in
    amd64) TRIPLET=x86_64-linux-gnu CUDA_TARGET=x86_64-linux ;;
    arm64) TRIPLET=aarch64-linux-gnu CUDA_TARGET=sbsa-linux ;;
    *) die "unsupported architecture $ARCH (NVIDIA ships these packages for amd64 and arm64)" ;;
esac
LIBDIR=/usr/lib/$TRIPLET

# The oldest glibc of the supported host systems (Ubuntu 20.04 and Debian 11 have 2.31). NVIDIA
# builds its driver libraries against an old glibc, so one libnvidia-ml.so loads on every
# distribution the driver supports. The stand-ins are compiled on this machine, whose glibc may be
# newer: a call such as stat() then binds to a symbol version the oldest hosts lack (stat@GLIBC_2.33),
# and there dlopen fails (pynvml: "NVML Shared Library Not Found"). pkg_end refuses such a file.
HOST_GLIBC_MAX=2.31

# ---------------------------------------------------------------------------------------------------
# Package DSL: pkg_begin, then put/put_file/put_link/maint_script/rel, then pkg_end builds the .deb.

WORK=''
REPO=''
BUILT=0
PKG_NAME='' PKG_VERSION='' PKG_ARCH='' PKG_SECTION='' PKG_SUMMARY='' PKG_ROOT=''
declare -A PKG_REL=()

# pkg_begin NAME VERSION ARCH SECTION SUMMARY
pkg_begin() {
    PKG_NAME=$1 PKG_VERSION=$2 PKG_ARCH=$3 PKG_SECTION=$4 PKG_SUMMARY=$5
    PKG_ROOT=$WORK/trees/${PKG_NAME}_$PKG_VERSION
    PKG_REL=()
    mkdir -p "$PKG_ROOT/DEBIAN"
}

# rel FIELD ITEM: append ITEM to a relationship field (Depends, Provides, Conflicts, Replaces).
rel() {
    PKG_REL[$1]=${PKG_REL[$1]:+${PKG_REL[$1]}, }$2
}

# exclusive_across_branches VIRTUAL: Ubuntu's pattern for driver branches. Every branch's package
# provides and conflicts with (and replaces) the same virtual name, so two branches can never be
# co-installed and installing another branch makes apt remove the current one. Debian policy lets a
# package conflict with a virtual package it provides itself.
exclusive_across_branches() {
    rel Provides "$1"
    rel Conflicts "$1"
    rel Replaces "$1"
}

# put PATH MODE < CONTENT
put() {
    mkdir -p "$PKG_ROOT$(dirname "$1")"
    cat >"$PKG_ROOT$1"
    chmod "$2" "$PKG_ROOT$1"
}

# put_file SOURCE PATH MODE
put_file() {
    put "$2" "$3" <"$1"
}

# put_dir PATH: an (empty) directory the package owns, so dpkg keeps it while the package is installed.
put_dir() {
    mkdir -p "$PKG_ROOT$1"
}

# put_link PATH TARGET
put_link() {
    mkdir -p "$PKG_ROOT$(dirname "$1")"
    ln -s "$2" "$PKG_ROOT$1"
}

# maint_script NAME < CONTENT: maintainer scripts (postinst, prerm) and the triggers file.
maint_script() {
    local mode=0755
    [[ $1 == triggers ]] && mode=0644
    cat >"$PKG_ROOT/DEBIAN/$1"
    chmod "$mode" "$PKG_ROOT/DEBIAN/$1"
}

# Shared libraries refresh the linker cache through libc-bin's ldconfig trigger, as Debian's own
# library packages do, instead of running ldconfig in every postinst.
ldconfig_trigger() {
    echo 'activate-noawait ldconfig' | maint_script triggers
}

# Installed-Size as dpkg-gencontrol computes it: KiB per regular file rounded up, 1 per other entry.
installed_size() {
    find "$PKG_ROOT" -mindepth 1 \( -path "$PKG_ROOT/DEBIAN" -prune \) -o \
        \( -type f -printf '%s\n' \) -o -printf '1024\n' |
        awk '{ kib += int(($1 + 1023) / 1024) } END { print kib + 0 }'
}

# glibc_newer_than_hosts FILE: the "SYMBOL@GLIBC_X.Y" references of an ELF file that the oldest
# supported host's glibc (HOST_GLIBC_MAX) does not have; nothing for any other file.
glibc_newer_than_hosts() {
    [[ $(head -c 4 "$1" | od -An -c | tr -d ' ') == 177ELF ]] || return 0
    objdump -T "$1" | awk -v max="$HOST_GLIBC_MAX" '
        # Version strings compare numerically part by part: 2.3.4 < 2.14 < 2.31 < 2.33.
        function newer(v, m,    a, b, i, n, nb) {
            n = split(v, a, ".")
            nb = split(m, b, ".")
            if (nb > n) n = nb
            for (i = 1; i <= n; i++)
                if (a[i] + 0 != b[i] + 0) return a[i] + 0 > b[i] + 0
            return 0
        }
        /\*UND\*/ && match($0, /GLIBC_[0-9.]+/) {
            v = substr($0, RSTART + 6, RLENGTH - 6)
            if (newer(v, max)) print $NF "@GLIBC_" v
        }' | sort -u
}

pkg_end() {
    put "/usr/share/doc/$PKG_NAME/README.harness" 0644 <<EOF
$PKG_NAME $PKG_VERSION is a simulated package built by the project's test harness
(tests/harness/apt_repo). It bears the name and version of NVIDIA's package but ships only
tiny stand-in files.
EOF
    local field control=$PKG_ROOT/DEBIAN/control
    {
        echo "Package: $PKG_NAME"
        echo "Version: $PKG_VERSION"
        echo "Architecture: $PKG_ARCH"
        echo "Maintainer: $MAINTAINER"
        echo "Installed-Size: $(installed_size)"
        for field in Depends Provides Conflicts Replaces; do
            if [[ -n ${PKG_REL[$field]:-} ]]; then echo "$field: ${PKG_REL[$field]}"; fi
        done
        echo "Section: $PKG_SECTION"
        echo "Priority: optional"
        echo "Description: $PKG_SUMMARY (simulated for tests)"
        echo " Simulated package for the project's tests: it carries the name, version and"
        echo " dependencies of NVIDIA's package but only tiny stand-in files. Never install"
        echo " it on a real host."
    } >"$control"
    local file too_new
    while IFS= read -r -d '' file; do
        too_new=$(glibc_newer_than_hosts "$file")
        [[ -z $too_new ]] || die "$PKG_NAME: ${file#"$PKG_ROOT"} needs a glibc newer than $HOST_GLIBC_MAX," \
            "the oldest supported hosts' (Ubuntu 20.04, Debian 11), which could not load it:" \
            "${too_new//$'\n'/ } (call something those hosts' glibc has)"
    done < <(find "$PKG_ROOT" -path "$PKG_ROOT/DEBIAN" -prune -o -type f -print0)
    chmod 0755 "$PKG_ROOT"
    find "$PKG_ROOT" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
    dpkg-deb --root-owner-group -Zgzip --build "$PKG_ROOT" "$REPO/" >/dev/null
    printf '  built %-34s %s\n' "$PKG_NAME" "$PKG_VERSION"
    BUILT=$((BUILT + 1))
}

# ---------------------------------------------------------------------------------------------------
# Helpers for package content.

# upstream_version DEB_VERSION: 525.147.05-0ubuntu1 -> 525.147.05, 2.15.5-1+cuda11.8 -> 2.15.5
upstream_version() {
    echo "${1%%-*}"
}

# stub_library PATH SONAME < C_SOURCE: a real (tiny) ELF shared object. Placeholder bytes would make
# every ldconfig run in the containers warn about a library that is not an ELF file.
stub_library() {
    local out
    out=$WORK/stubs/$(basename "$1")
    mkdir -p "$WORK/stubs"
    "$CC" -shared -fPIC -O2 -s -Wl,-soname,"$2" -o "$out" -x c - -x none "${@:3}" ||
        die "compiling stub library $1 failed"
    put_file "$out" "$1" 0644
}

# empty_archive PATH: a static library with no members (CMake and the linker accept it).
empty_archive() {
    mkdir -p "$PKG_ROOT$(dirname "$1")"
    printf '!<arch>\n' >"$PKG_ROOT$1"
    chmod 0644 "$PKG_ROOT$1"
}

# cudart_source CUDA: the runtime calls the simulation answers, like a runtime on a host where no GPU
# answers (cudaErrorNoDevice); the version is the release's.
cudart_source() {
    cat <<EOF
/* Simulated CUDA $1 runtime (the project's test harness). */
int cudaRuntimeGetVersion(int *version) { *version = ${1%%.*}000 + ${1#*.} * 10; return 0; }
int cudaGetDeviceCount(int *count) { *count = 0; return 100; }
int cudaGetDeviceProperties(void *prop, int device) { (void)prop; (void)device; return 100; }
/* What nvcc's host stubs call when a library with device code loads. */
static void *simulated_handle;
void **__cudaRegisterFatBinary(void *fatbin) { (void)fatbin; return &simulated_handle; }
void __cudaRegisterFatBinaryEnd(void **handle) { (void)handle; }
void __cudaUnregisterFatBinary(void **handle) { (void)handle; }
EOF
}

# cudart_header PATH CUDA: the declarations of what cudart_source defines (CMake's ABI probe uses them).
cudart_header() {
    put "$1" 0644 <<EOF
/* Simulated cuda_runtime.h of CUDA $2 (the project's test harness): what the simulated runtime answers. */
#ifndef SIMULATED_CUDA_RUNTIME_H
#define SIMULATED_CUDA_RUNTIME_H
#define CUDART_VERSION $((${2%%.*} * 1000 + ${2#*.} * 10))
typedef enum cudaError { cudaSuccess = 0, cudaErrorNoDevice = 100 } cudaError_t;
struct cudaDeviceProp { char name[256]; int major; int minor; char reserved[1024]; };
#ifdef __cplusplus
extern "C" {
#endif
cudaError_t cudaRuntimeGetVersion(int *version);
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device);
#ifdef __cplusplus
}
#endif
#endif
EOF
}

# static_library PATH: a static library of the C source on stdin.
static_library() {
    local out=$WORK/stubs/$(basename "$1")
    mkdir -p "$WORK/stubs"
    "$CC" -c -fPIC -O2 -o "$out.o" -x c - || die "compiling static library $1 failed"
    rm -f "$out" && ar rcs "$out" "$out.o" || die "archiving $1 failed"
    put_file "$out" "$1" 0644
}

# cuda_header PATH CUDA: a placeholder for a toolkit header (FindCUDAToolkit looks for it; the
# simulated nvcc compiles no device code, so nothing reads more than the version).
cuda_header() {
    local guard
    guard=SIMULATED_$(basename "$1" | tr 'a-z.' 'A-Z_')
    put "$1" 0644 <<EOF
/* Simulated $(basename "$1") of CUDA $2 (the project's test harness). */
#ifndef $guard
#define $guard
#define CUDART_VERSION $((${2%%.*} * 1000 + ${2#*.} * 10))
#endif
EOF
}

# build_mock_nvml DRIVER_VERSION CUDA_DRIVER_API: prints the build directory holding the mock
# libnvidia-ml.so.1 that reports that driver.
build_mock_nvml() {
    local dir=$WORK/mock_nvml/$1
    mkdir -p "$dir"
    if ! make -C "$MOCK_NVML_DIR" BUILD_DIR="$dir" DRIVER_VERSION="$1" \
        CUDA_DRIVER_VERSION="$2" >"$dir.log" 2>&1; then
        cat "$dir.log" >&2
        die "building the mock NVML library for driver $1 failed"
    fi
    [[ -f $dir/libnvidia-ml.so.1 ]] || die "make in $MOCK_NVML_DIR did not produce $dir/libnvidia-ml.so.1"
    echo "$dir"
}

# mock_tool BUILD_DIR NAME: a mock tool (nvidia-smi, ...), preferring a copy the build generated over
# the one in the source directory.
mock_tool() {
    local dir
    for dir in "$1" "$MOCK_NVML_DIR"; do
        [[ -f $dir/$2 ]] && { echo "$dir/$2"; return; }
    done
    die "mock NVML file $2 not found in $1 or $MOCK_NVML_DIR"
}

# ---------------------------------------------------------------------------------------------------
# Package families: one call per line of packages.spec.

# keyring VERSION
keyring() {
    pkg_begin cuda-keyring "$1" all misc "GPG keyring for NVIDIA's CUDA repository"
    # NVIDIA's real cuda-keyring also ships /etc/apt/sources.list.d/cuda-<distro>-<arch>.list. This one
    # does not: in the tests the role itself configures the (local) mirror, and a shipped list would
    # point apt at an unreachable host.
    put /usr/share/keyrings/cuda-archive-keyring.gpg 0644 <<<'placeholder keyring: the test repository is trusted=yes'
    pkg_end
}

# driver_branch BRANCH DEB_VERSION CUDA_DRIVERS_VERSION CUDA_DRIVER_API
driver_branch() {
    local branch=$1 version=$2 cuda_drivers_version=$3 api=$4
    local driver nvml smi persistenced unit
    driver=$(upstream_version "$version")
    nvml=$(build_mock_nvml "$driver" "$api")
    smi=$(mock_tool "$nvml" nvidia-smi)
    persistenced=$(mock_tool "$nvml" nvidia-persistenced)
    unit=$(mock_tool "$nvml" nvidia-persistenced.service)

    pkg_begin "libnvidia-compute-$branch" "$version" "$ARCH" libs "NVIDIA libcompute package"
    exclusive_across_branches libnvidia-compute
    put_file "$nvml/libnvidia-ml.so.1" "$LIBDIR/libnvidia-ml.so.$driver" 0644
    put_link "$LIBDIR/libnvidia-ml.so.1" "libnvidia-ml.so.$driver"
    # The CUDA driver library llama.cpp's CUDA backend links: answers like a driver that sees no
    # device (there is no kernel module in a container).
    stub_library "$LIBDIR/libcuda.so.$driver" libcuda.so.1 <<EOF
int cuInit(unsigned int flags) { (void)flags; return 100; /* CUDA_ERROR_NO_DEVICE */ }
int cuDriverGetVersion(int *version) { *version = $api; return 0; }
EOF
    put_link "$LIBDIR/libcuda.so.1" "libcuda.so.$driver"
    ldconfig_trigger
    pkg_end

    pkg_begin "nvidia-utils-$branch" "$version" "$ARCH" utils "NVIDIA driver support binaries"
    exclusive_across_branches nvidia-utils
    rel Depends "libnvidia-compute-$branch (= $version)"
    put_file "$smi" /usr/bin/nvidia-smi 0755
    pkg_end

    pkg_begin "nvidia-compute-utils-$branch" "$version" "$ARCH" utils "NVIDIA compute utilities"
    exclusive_across_branches nvidia-compute-utils
    rel Depends "libnvidia-compute-$branch (= $version)"
    put_file "$persistenced" /usr/bin/nvidia-persistenced 0755
    put_file "$unit" /lib/systemd/system/nvidia-persistenced.service 0644
    # Like Ubuntu's package, create the unprivileged user the daemon runs as. Unlike it, neither
    # enable nor start the unit: the GPU tuning role does that, and its tests must see it do so.
    maint_script postinst <<'EOF'
#!/bin/sh
set -e
if [ "$1" = configure ] && ! getent passwd nvidia-persistenced >/dev/null \
        && command -v useradd >/dev/null; then
    useradd --system --user-group --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin nvidia-persistenced
fi
EOF
    pkg_end

    # No kernel module: containers cannot load one. The dkms.conf only marks where DKMS sources live.
    pkg_begin "nvidia-dkms-$branch" "$version" "$ARCH" kernel "NVIDIA DKMS package"
    exclusive_across_branches nvidia-dkms-kernel
    rel Depends "nvidia-kernel-common-$branch (= $version)"
    put "/usr/src/nvidia-$driver/dkms.conf" 0644 <<EOF
# Placeholder from the test harness: no module sources, nothing for DKMS to build.
PACKAGE_NAME="nvidia"
PACKAGE_VERSION="$driver"
EOF
    pkg_end

    pkg_begin "nvidia-kernel-common-$branch" "$version" "$ARCH" kernel "Shared files used with the kernel module"
    exclusive_across_branches nvidia-kernel-common
    pkg_end

    pkg_begin "nvidia-driver-$branch" "$version" "$ARCH" metapackages "NVIDIA driver metapackage"
    exclusive_across_branches nvidia-driver-binary
    local dep
    for dep in nvidia-utils libnvidia-compute nvidia-compute-utils nvidia-dkms nvidia-kernel-common; do
        rel Depends "$dep-$branch (= $version)"
    done
    pkg_end

    pkg_begin "cuda-drivers-$branch" "$cuda_drivers_version" "$ARCH" metapackages "CUDA Driver native Linux package"
    rel Depends "nvidia-driver-$branch (>= $driver)"
    pkg_end
}

# cuda_drivers_meta VERSION BRANCH
cuda_drivers_meta() {
    pkg_begin cuda-drivers "$1" "$ARCH" metapackages "CUDA Driver meta-package, branch-agnostic"
    rel Depends "cuda-drivers-$2 (= $1)"
    pkg_end
}

# cuda_toolkit CUDA META_VERSION COMPONENT_VERSION NVCC_BUILT_ON NVCC_BUILD
# CUDA is MAJOR.MINOR; components (nvcc, cudart, config) carry their own version, as in NVIDIA's repo.
cuda_toolkit() {
    local cuda=$1 meta_version=$2 version=$3 built_on=$4 build=$5
    local major=${cuda%%.*} dashed=${cuda//./-}
    local prefix=/usr/local/cuda-$cuda component
    component=$(upstream_version "$version")
    local libdir=$prefix/targets/$CUDA_TARGET/lib
    # cudart's soname is libcudart.so.11.0 for every CUDA 11 and libcudart.so.12 for CUDA 12.
    local cudart_soname=libcudart.so.$major
    ((major < 12)) && cudart_soname=libcudart.so.$major.0

    # Unversioned and shared by every toolkit, so the repository holds one version per toolkit and an
    # unpinned install of an older toolkit still pulls the newest: a pin has to cover it too.
    pkg_begin cuda-toolkit-config-common "$version" all devel "Common config package for CUDA Toolkit"
    put /etc/ld.so.conf.d/000_cuda.conf 0644 <<<"/usr/local/cuda/targets/$CUDA_TARGET/lib"
    ldconfig_trigger
    pkg_end

    # Per-version: points the /usr/local/cuda and /usr/local/cuda-MAJOR alternatives at this toolkit
    # with priority MAJORMINOR (118, 122), as NVIDIA's packages do. It owns the prefix directory so the
    # alternative's target outlives the toolkit's other packages until its own prerm removes it.
    pkg_begin "cuda-toolkit-$dashed-config-common" "$version" all devel "Common config package for CUDA Toolkit $cuda"
    put_dir "$prefix"
    maint_script postinst <<EOF
#!/bin/sh
set -e
if [ "\$1" = configure ]; then
    update-alternatives --install /usr/local/cuda cuda $prefix ${cuda//./}
    update-alternatives --install /usr/local/cuda-$major cuda-$major $prefix ${cuda//./}
fi
EOF
    maint_script prerm <<EOF
#!/bin/sh
set -e
if [ "\$1" = remove ] || [ "\$1" = deconfigure ]; then
    update-alternatives --remove cuda $prefix
    update-alternatives --remove cuda-$major $prefix
fi
EOF
    pkg_end

    pkg_begin "cuda-cudart-$dashed" "$version" "$ARCH" devel "CUDA Runtime native Libraries"
    rel Depends "cuda-toolkit-$dashed-config-common"
    rel Depends "cuda-toolkit-config-common"
    cudart_source "$cuda" | stub_library "$libdir/libcudart.so.$component" "$cudart_soname"
    put_link "$libdir/$cudart_soname" "libcudart.so.$component"
    put_link "$prefix/lib64" "targets/$CUDA_TARGET/lib"
    pkg_end

    pkg_begin "cuda-cudart-dev-$dashed" "$version" "$ARCH" devel "CUDA Runtime native dev links, headers"
    rel Depends "cuda-cudart-$dashed (>= $component)"
    put_link "$libdir/libcudart.so" "$cudart_soname"
    cudart_source "$cuda" | static_library "$libdir/libcudart_static.a"
    empty_archive "$libdir/libcudadevrt.a"
    empty_archive "$libdir/libculibos.a"
    cudart_header "$prefix/targets/$CUDA_TARGET/include/cuda_runtime.h" "$cuda"
    cuda_header "$prefix/targets/$CUDA_TARGET/include/cuda_runtime_api.h" "$cuda"
    put_link "$prefix/include" "targets/$CUDA_TARGET/include"
    pkg_end

    pkg_begin "cuda-driver-dev-$dashed" "$version" "$ARCH" devel "CUDA Driver native dev stub library"
    stub_library "$libdir/stubs/libcuda.so" libcuda.so.1 <<<'int cuInit(unsigned int f) { (void)f; return 100; } int cuDriverGetVersion(int *v) { *v = 0; return 100; }'
    cuda_header "$prefix/targets/$CUDA_TARGET/include/cuda.h" "$cuda"
    pkg_end

    # cuBLAS: soname libcublas.so.MAJOR, as in NVIDIA's libcublas-MAJOR-MINOR packages.
    pkg_begin "libcublas-$dashed" "$version" "$ARCH" libs "CUBLAS native runtime libraries"
    rel Depends "cuda-toolkit-$dashed-config-common"
    # libcublas needs libcublasLt, as NVIDIA's does: a program linked with -lcublas gets both.
    stub_library "$libdir/libcublasLt.so.$component" "libcublasLt.so.$major" <<<'int cublasLtCreate(void **handle) { *handle = 0; return 1; }'
    stub_library "$libdir/libcublas.so.$component" "libcublas.so.$major" -Wl,--no-as-needed "$WORK/stubs/libcublasLt.so.$component" \
        <<<'int cublasLtCreate(void **handle); int cublasCreate_v2(void **handle) { return cublasLtCreate(handle); }'
    put_link "$libdir/libcublas.so.$major" "libcublas.so.$component"
    put_link "$libdir/libcublasLt.so.$major" "libcublasLt.so.$component"
    pkg_end

    pkg_begin "libcublas-dev-$dashed" "$version" "$ARCH" devel "CUBLAS native dev links, headers"
    rel Depends "libcublas-$dashed (>= $component)"
    put_link "$libdir/libcublas.so" "libcublas.so.$major"
    put_link "$libdir/libcublasLt.so" "libcublasLt.so.$major"
    cuda_header "$prefix/targets/$CUDA_TARGET/include/cublas_v2.h" "$cuda"
    pkg_end

    # The simulated compiler (cuda/nvcc beside this script): a build's CUDA branch runs to its end;
    # device code becomes a record of its architectures, which the simulated cuobjdump lists.
    pkg_begin "cuda-nvcc-$dashed" "$version" "$ARCH" devel "CUDA nvcc"
    rel Depends "cuda-toolkit-$dashed-config-common"
    put_file "$HERE/cuda/nvcc" "$prefix/bin/nvcc" 0755
    put_file "$HERE/cuda/recorded/nvcc-11.8-v-compiler-id.txt" "$prefix/bin/.nvcc-simulated-v.txt" 0644
    put "$prefix/bin/.nvcc-simulated.json" 0644 <<EOF
{"release": "$cuda", "version": "$component", "built_on": "$built_on", "build": "$build", "target": "$CUDA_TARGET"}
EOF
    put "$prefix/version.json" 0644 <<EOF
{
   "cuda" : {
      "name" : "CUDA SDK",
      "version" : "$(upstream_version "$meta_version")"
   },
   "cuda_cudart" : {
      "name" : "CUDA Runtime (cudart)",
      "version" : "$component"
   },
   "cuda_nvcc" : {
      "name" : "CUDA NVCC",
      "version" : "$component"
   }
}
EOF
    pkg_end

    pkg_begin "cuda-cuobjdump-$dashed" "$version" "$ARCH" devel "CUDA cuobjdump"
    put_file "$HERE/cuda/cuobjdump" "$prefix/bin/cuobjdump" 0755
    pkg_end

    pkg_begin "cuda-toolkit-$dashed" "$meta_version" "$ARCH" metapackages "CUDA Toolkit $cuda meta-package"
    rel Depends "cuda-nvcc-$dashed (>= $component)"
    rel Depends "cuda-cuobjdump-$dashed (>= $component)"
    rel Depends "cuda-cudart-$dashed (>= $component)"
    rel Depends "cuda-cudart-dev-$dashed (>= $component)"
    rel Depends "cuda-driver-dev-$dashed (>= $component)"
    rel Depends "libcublas-dev-$dashed (>= $component)"
    rel Depends "cuda-toolkit-$dashed-config-common (>= $component)"
    rel Depends "cuda-toolkit-config-common (>= $component)"
    pkg_end
}

# cuda_toolkit_meta VERSION CUDA
cuda_toolkit_meta() {
    pkg_begin cuda-toolkit "$1" "$ARCH" metapackages "CUDA Toolkit meta-package, version-agnostic"
    rel Depends "cuda-toolkit-${2//./-} (>= $(upstream_version "$1"))"
    pkg_end
}

# nccl DEB_VERSION (e.g. 2.15.5-1+cuda11.8)
nccl() {
    local version=$1 upstream major minor patch
    upstream=$(upstream_version "$version")
    IFS=. read -r major minor patch <<<"$upstream"
    # NCCL >= 2.9 encodes its version as MAJOR*10000 + MINOR*100 + PATCH.
    local code=$((10#$major * 10000 + 10#$minor * 100 + 10#$patch))

    pkg_begin libnccl2 "$version" "$ARCH" libs "NVIDIA Collective Communication Library (NCCL) Runtime"
    stub_library "$LIBDIR/libnccl.so.$upstream" "libnccl.so.$major" <<EOF
/* ncclGetVersion() answers like NCCL $upstream; nothing else is implemented. */
int ncclGetVersion(int *version) { *version = $code; return 0; }
EOF
    put_link "$LIBDIR/libnccl.so.$major" "libnccl.so.$upstream"
    ldconfig_trigger
    pkg_end

    pkg_begin libnccl-dev "$version" "$ARCH" libdevel "NVIDIA Collective Communication Library (NCCL) Development Files"
    rel Depends "libnccl2 (= $version)"
    put_link "$LIBDIR/libnccl.so" "libnccl.so.$major"
    # The version block of the real header. The real one also includes cuda_runtime.h, left out so
    # the header preprocesses without a CUDA toolkit.
    put /usr/include/nccl.h 0644 <<EOF
/* Simulated nccl.h from the project's test harness: version macros of NCCL $upstream only. */
#ifndef NCCL_H_
#define NCCL_H_

#define NCCL_MAJOR $major
#define NCCL_MINOR $minor
#define NCCL_PATCH $patch
#define NCCL_SUFFIX ""

#define NCCL_VERSION_CODE $code
#define NCCL_VERSION(X,Y,Z) (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : \\
                             (X) * 10000 + (Y) * 100 + (Z))

typedef enum { ncclSuccess = 0 } ncclResult_t;
ncclResult_t ncclGetVersion(int *version);

#endif /* NCCL_H_ */
EOF
    pkg_end
}

# ---------------------------------------------------------------------------------------------------
# Spec, index, stamp.

# The family builders packages.spec may call, and how many arguments each takes.
declare -A FAMILY_ARGS=(
    [keyring]=1 [driver_branch]=4 [cuda_drivers_meta]=2
    [cuda_toolkit]=5 [cuda_toolkit_meta]=2 [nccl]=1
)

build_from_spec() {
    local line family lineno=0 entry
    local -a args entries=()
    # Validate the whole spec before building anything, so a typo fails fast.
    while IFS= read -r line || [[ -n $line ]]; do
        lineno=$((lineno + 1))
        line=${line%%#*}
        read -r -a args <<<"$line"
        ((${#args[@]})) || continue
        family=${args[0]}
        # The spec is data: only the family builders may be called from it.
        [[ -n ${FAMILY_ARGS[$family]:-} ]] || die "$SPEC:$lineno: unknown family '$family'"
        ((${#args[@]} - 1 == FAMILY_ARGS[$family])) ||
            die "$SPEC:$lineno: $family takes ${FAMILY_ARGS[$family]} arguments, got $((${#args[@]} - 1))"
        entries+=("$line")
    done <"$SPEC"
    for entry in "${entries[@]}"; do
        read -r -a args <<<"$entry"
        "${args[@]}"
    done
}

# Flat repository: Packages, Packages.gz and an unsigned Release (the sources entry is trusted=yes).
# The Release file is written here rather than by apt-ftparchive, which is not always installed and
# stamps the current date into it.
index_repo() {
    (cd "$REPO" && dpkg-scanpackages --multiversion . /dev/null 2>/dev/null) >"$REPO/Packages"
    gzip -9n <"$REPO/Packages" >"$REPO/Packages.gz"
    local sum name
    {
        # Origin and Label as in NVIDIA's repository, so origin-based pins behave as on real hosts.
        echo "Origin: NVIDIA"
        echo "Label: NVIDIA CUDA"
        echo "Architectures: $ARCH all"
        echo "Date: $(date -u -d "@$SOURCE_DATE_EPOCH" '+%a, %d %b %Y %H:%M:%S UTC')"
        echo "Description: Simulated NVIDIA CUDA repository of the project's test harness"
        for sum in MD5Sum:md5sum SHA256:sha256sum; do
            echo "${sum%%:*}:"
            for name in Packages Packages.gz; do
                printf ' %s %s %s\n' "$("${sum#*:}" <"$REPO/$name" | cut -d' ' -f1)" \
                    "$(stat -c %s "$REPO/$name")" "$name"
            done
        done
    } >"$REPO/Release"
}

# Hash of everything the repository is built from, independent of where the checkout lives.
input_hash() {
    {
        echo "arch=$ARCH"
        (cd "$HERE" && sha256sum build-repo.sh packages.spec cuda/nvcc cuda/cuobjdump cuda/recorded/*)
        # Mock NVML sources, minus build products left in the source tree.
        (cd "$MOCK_NVML_DIR" &&
            find . \( -name build -o -name __pycache__ -o -name '.*cache' \) -prune -o -type f \
                ! -name '*.o' ! -name '*.so' ! -name '*.so.*' ! -name '*.pyc' -print0 |
            sort -z | xargs -0 -r sha256sum)
    } | sha256sum | cut -d' ' -f1
}

# The output is current when its stamp matches and every indexed .deb is still there.
is_current() {
    local out=$1 hash=$2 file
    [[ -f $out/$STAMP_NAME && $(<"$out/$STAMP_NAME") == "$hash" && -f $out/Packages ]] || return 1
    while read -r file; do
        [[ -f $out/$file ]] || return 1
    done < <(sed -n 's/^Filename: //p' "$out/Packages")
}

main() {
    (($# == 1)) || { echo "usage: $0 OUTPUT_DIR" >&2; exit 2; }
    local out tool hash
    out=$(readlink -m "$1")
    for tool in dpkg-deb dpkg-scanpackages make "$CC" objdump gzip sha256sum md5sum; do
        command -v "$tool" >/dev/null || die "$tool is required"
    done
    [[ -f $MOCK_NVML_DIR/Makefile ]] || die "no Makefile in $MOCK_NVML_DIR (mock NVML sources)"
    MOCK_NVML_DIR=$(readlink -f "$MOCK_NVML_DIR")

    hash=$(input_hash)
    if is_current "$out" "$hash"; then
        echo "build-repo: $out is up to date (inputs ${hash:0:12}); nothing rebuilt"
        return 0
    fi
    # OUTPUT_DIR is emptied before publishing: never do that to a directory this script did not make.
    if [[ -d $out && -n $(ls -A "$out") && ! -f $out/$STAMP_NAME ]]; then
        die "$out is not empty and holds no $STAMP_NAME: refusing to replace its contents"
    fi

    WORK=$(mktemp -d "${TMPDIR:-/tmp}/build-repo.XXXXXX")
    trap 'rm -rf "$WORK"' EXIT
    REPO=$WORK/repo
    mkdir -p "$REPO"
    echo "build-repo: building the simulated NVIDIA repository into $out ($ARCH)"
    build_from_spec
    index_repo

    # Publish in place (a running container may bind-mount OUTPUT_DIR); the stamp goes last so an
    # interrupted run never looks current.
    mkdir -p "$out"
    rm -f "$out/$STAMP_NAME"
    find "$out" -mindepth 1 -delete
    mv "$REPO"/* "$out"/
    echo "$hash" >"$out/$STAMP_NAME"
    echo "build-repo: built $BUILT packages into $out (inputs ${hash:0:12})"
}

main "$@"
