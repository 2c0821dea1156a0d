# syntax=docker/dockerfile:1
# The sharder image: a static binary on distroless, running as non-root.
#   docker build --build-arg VERSION=$(git describe --tags --always) -t ghcr.io/sharder-dev/sharder:0.1.0 .
# make images builds the same image (user, entrypoint, static binary) without Docker.

ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
ARG TARGETOS
ARG TARGETARCH
ARG VERSION=dev
WORKDIR /src
# Dependencies first: this layer is reused until go.mod or go.sum change.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY cmd/ cmd/
COPY pkg/ pkg/
COPY internal/ internal/
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} GOFLAGS=-buildvcs=false \
    go build -trimpath \
      -ldflags "-s -w -X github.com/sharder-dev/sharder/cmd/sharder/app.version=${VERSION}" \
      -o /out/sharder ./cmd/sharder

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/sharder /sharder
USER 65532:65532
ENTRYPOINT ["/sharder"]
CMD ["run"]
