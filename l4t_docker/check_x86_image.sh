#!/usr/bin/env bash
# Slow check (make test-image): build the x86 image with a local Docker engine and wait until its
# container reports healthy. No registry is needed: the base image is made locally with debootstrap.
# Needs root, docker.io and debootstrap (Debian packages). Seen here: 22 s for the base, under 2 min
# for the first image build (15 s when cached), ~20 s until healthy.
set -euo pipefail
cd "$(dirname "$0")/.."
TAG=${TAG:-edge-runtime:x86-check}
BASE=debian:bookworm-slim

step() { echo "[$1] $2 (t=${SECONDS}s)"; }
die() { echo "error: $*" >&2; exit 1; }

step 1/5 "Docker engine"
if ! docker info >/dev/null 2>&1; then
  command -v dockerd >/dev/null || die "step 1/5: dockerd not found (apt-get install docker.io)"
  (dockerd --iptables=false --bridge=none >/tmp/edge-dockerd.log 2>&1 &)
  for _ in $(seq 1 30); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || die "step 1/5: dockerd did not start (see /tmp/edge-dockerd.log)"
fi

step 2/5 "base image $BASE (debootstrap, no registry)"
if ! docker image inspect "$BASE" >/dev/null 2>&1; then
  root=$(mktemp -d)
  debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian >/tmp/edge-debootstrap.log 2>&1 \
    || die "step 2/5: debootstrap failed (see /tmp/edge-debootstrap.log)"
  tar -C "$root" -c . | docker import - "$BASE" >/dev/null
  rm -rf "$root"
fi

step 3/5 "llama.cpp wheel and proxy CA"
if ! ls l4t_docker/wheels/llama_cpp_python-*.whl >/dev/null 2>&1; then
  wheel=$(find "${HOME}/.cache/pip/wheels" -name 'llama_cpp_python-*.whl' 2>/dev/null | head -1 || true)
  [ -n "$wheel" ] && cp "$wheel" l4t_docker/wheels/
fi
cp /usr/local/share/ca-certificates/*.crt l4t_docker/ca/ 2>/dev/null || true

step 4/5 "build $TAG"
build_start=$SECONDS
docker build --network host ${NO_CACHE:+--no-cache} -f l4t_docker/Dockerfile.x86 -t "$TAG" . \
  >/tmp/edge-image-build.log 2>&1 || { tail -30 /tmp/edge-image-build.log; die "step 4/5: docker build failed"; }
echo "build: $((SECONDS - build_start)) s; image size: $(docker image inspect --format '{{.Size}}' "$TAG" | \
  awk '{printf "%.0f MB", $1 / 1e6}')"

step 5/5 "run and wait for healthy"
name=edge-runtime-check-$$
run_start=$SECONDS
docker run -d --network host --name "$name" "$TAG" >/dev/null
trap 'docker rm -f "$name" >/dev/null 2>&1 || true' EXIT
for _ in $(seq 1 100); do
  status=$(docker inspect --format '{{.State.Health.Status}}' "$name")
  # the health check's first probe waits its 15 s interval: poll /readyz too, to time readiness itself
  curl -fsS http://127.0.0.1:8080/readyz >/dev/null 2>&1 && [ -z "${ready_at:-}" ] && ready_at=$((SECONDS - run_start)) \
    && echo "/readyz answered after ${ready_at} s"
  [ "$status" = healthy ] && { echo "healthy after $((SECONDS - run_start)) s"; curl -fsS http://127.0.0.1:8080/readyz; echo; exit 0; }
  [ "$status" = unhealthy ] && break
  sleep 1
done
docker logs "$name" 2>&1 | tail -20
die "step 5/5: the container did not turn healthy (last status: $status)"
