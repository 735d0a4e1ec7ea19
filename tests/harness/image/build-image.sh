#!/usr/bin/env bash
# Build the base image of the simulated V100 hosts: Debian 12 (bookworm), or
# Debian 11 (bullseye, the oldest release this machine's mirror serves: Python
# 3.9, systemd 247, cmake 3.18), with systemd as PID 1, made locally with debootstrap + `docker import` because no
# container registry is reachable. The image is tagged with a hash of its recipe
# and reused while that hash is current, so reruns cost a second.
#
# Usage: build-image.sh [IMAGE [SUITE]]   (default: llm-fleet/host:bookworm bookworm)
# Env:   DEBIAN_MIRROR  (default: http://deb.debian.org/debian)
#        FORCE=1        rebuild even when current
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
image=${1:-llm-fleet/host:bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
suite=${2:-bookworm}

list() { grep -v -e '^#' -e '^$' "$here/$1" | paste -sd, -; }
installed=$(list installed-packages.txt)
mirrored=$(list mirrored-packages.txt | tr , ' ')

recipe_hash=$( (echo "$suite"; cat "$here/build-image.sh" "$here/installed-packages.txt" \
  "$here/mirrored-packages.txt") | sha256sum | cut -c1-12)
versioned="${image%%:*}:${suite}-${recipe_hash}"

if [ "${FORCE:-0}" != 1 ] && docker image inspect "$versioned" >/dev/null 2>&1; then
  docker tag "$versioned" "$image"
  echo "image $image is current ($versioned), reused"
  exit 0
fi

for tool in debootstrap docker; do
  command -v "$tool" >/dev/null || { echo "build-image: '$tool' not found; run 'make setup' or install it" >&2; exit 1; }
done

work=$(mktemp -d /var/tmp/llm-fleet-image.XXXXXX)
rootfs="$work/rootfs"
cleanup() {
  # Bind mounts first, or rm would walk into the host's /proc.
  for m in proc dev/pts dev; do umount -l "$rootfs/$m" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

echo "build-image: debootstrap $suite ($installed)"
start=$SECONDS
debootstrap --variant=minbase --include="$installed" "$suite" "$rootfs" "$mirror" \
  > "$work/debootstrap.log" 2>&1 || { tail -n 30 "$work/debootstrap.log" >&2; exit 1; }
echo "build-image: debootstrap took $((SECONDS - start)) s"

# A local Debian mirror inside the image: the packages the roles install,
# with their dependencies, resolved against what the image already has.
mount -t proc proc "$rootfs/proc"
mount --bind /dev "$rootfs/dev"
cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
echo "deb $mirror $suite main" > "$rootfs/etc/apt/sources.list"
chroot "$rootfs" apt-get update -qq
# shellcheck disable=SC2086 # word splitting of the package list is intended
chroot "$rootfs" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -qq --download-only --no-install-recommends $mirrored >/dev/null
mkdir -p "$rootfs/srv/debian-mirror"
mv "$rootfs"/var/cache/apt/archives/*.deb "$rootfs/srv/debian-mirror/"
(cd "$rootfs/srv/debian-mirror" && dpkg-scanpackages --multiversion . /dev/null 2>/dev/null > Packages)
echo "build-image: local mirror holds $(ls "$rootfs/srv/debian-mirror" | grep -c '\.deb$') packages"

# The hosts have no network: apt sees only the local mirror. The NVIDIA
# repository is added by the nvidia_stack role itself (a mirror URL variable).
rm -f "$rootfs/etc/apt/sources.list" "$rootfs"/etc/apt/sources.list.d/*
echo "deb [trusted=yes] file:/srv/debian-mirror ./" > "$rootfs/etc/apt/sources.list.d/debian-mirror.list"
chroot "$rootfs" apt-get update -qq
rm -rf "$rootfs"/var/lib/apt/lists/*_dists_* "$rootfs"/var/cache/apt/*.bin

# Units that have no hardware to manage in a container only slow boot down.
for unit in systemd-udevd.service systemd-udev-trigger.service getty@tty1.service \
  console-getty.service systemd-modules-load.service; do
  ln -sf /dev/null "$rootfs/etc/systemd/system/$unit"
done
# A container without CAP_SYS_ADMIN cannot bind-mount, and systemd refuses to start a
# unit with Bind*Paths= there (226/NAMESPACE), where it only skips ProtectSystem= and
# the like. Debian's haproxy.service binds /dev/log into HAProxy's chroot for logging:
# the hosts of this image start it without that bind (HAProxy then logs nothing),
# as any unit with Bind*Paths= would need. A real host keeps the package's unit.
mkdir -p "$rootfs/etc/systemd/system/haproxy.service.d"
printf '[Service]\n# container: no bind mounts (tests/harness/image/build-image.sh)\nBindReadOnlyPaths=\n' \
  > "$rootfs/etc/systemd/system/haproxy.service.d/container-no-bind.conf"
# Debian's prometheus.service runs in its own user namespace (PrivateUsers=yes), which an
# unprivileged container cannot create (217/USER): the hosts of this image start it
# without one. A real host keeps the package's unit.
mkdir -p "$rootfs/etc/systemd/system/prometheus.service.d"
printf '[Service]\n# container: no user namespace (tests/harness/image/build-image.sh)\nPrivateUsers=no\n' \
  > "$rootfs/etc/systemd/system/prometheus.service.d/container-no-userns.conf"
# A fresh machine-id per container, as on a freshly provisioned host.
: > "$rootfs/etc/machine-id"
rm -f "$rootfs/etc/resolv.conf"

for m in proc dev; do umount -l "$rootfs/$m"; done
tar -C "$rootfs" -c . | docker import \
  -c 'CMD ["/lib/systemd/systemd"]' -c 'ENV container=docker' \
  - "$versioned" >/dev/null
docker tag "$versioned" "$image"
echo "build-image: built $image ($versioned) in $((SECONDS - start)) s"
