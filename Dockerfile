# The image deploy/kubernetes/daemonset.yaml runs (ghcr.io/condfs/condfs).
#   docker build -t ghcr.io/condfs/condfs:latest .
# Build stage: a static binary (no cgo), trimmed of local paths.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/condfs ./cmd/condfs

# Runtime: fuse3 gives fusermount3 (for a non-root container) and the
# fuse tools; the daemon itself needs /dev/fuse and, as root, CAP_SYS_ADMIN.
FROM debian:bookworm-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends fuse3 ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/condfs /usr/local/bin/condfs
ENTRYPOINT ["/usr/local/bin/condfs"]
CMD ["serve", "--root", "/srv/agent", "--socket", "/run/condfs/condfs.sock"]
