# docker buildx bake -f l4t_docker/docker-bake.hcl          (all images)
# docker buildx bake -f l4t_docker/docker-bake.hcl x86      (one)
variable "VERSION" { default = "0.1.0" }
group "default" { targets = ["jp6", "jp5", "x86"] }
target "common" {
  context = "."
  args = { VERSION = "${VERSION}" }
}
target "jp6" {
  inherits = ["common"]
  dockerfile = "l4t_docker/Dockerfile.jp6"
  platforms = ["linux/arm64"]
  tags = ["edge-runtime:jp6", "edge-runtime:${VERSION}-jp6"]
}
target "jp5" {
  inherits = ["common"]
  dockerfile = "l4t_docker/Dockerfile.jp5"
  platforms = ["linux/arm64"]
  tags = ["edge-runtime:jp5", "edge-runtime:${VERSION}-jp5"]
}
target "x86" {
  inherits = ["common"]
  dockerfile = "l4t_docker/Dockerfile.x86"
  platforms = ["linux/amd64"]
  tags = ["edge-runtime:x86", "edge-runtime:${VERSION}-x86"]
}
