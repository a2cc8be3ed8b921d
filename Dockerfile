# A static kproxy binary on a minimal base. Build: docker build -t kproxy .
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/kproxy ./cmd/kproxy

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/kproxy /kproxy
COPY configs/kproxy.yaml /etc/kproxy/kproxy.yaml
# 9092: bootstrap; 9093+N: broker N; 9644: admin (health, metrics, web view)
EXPOSE 9092 9093 9094 9095 9644
ENTRYPOINT ["/kproxy"]
CMD ["serve", "--config", "/etc/kproxy/kproxy.yaml"]
