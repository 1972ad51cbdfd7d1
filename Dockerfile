# jetfabric image, built FROM scratch: no base image is pulled.
#
# It holds the static binary that `make build` writes to bin/jetfabric
# (CGO_ENABLED=0, CPU backend) and an empty /data owned by the non-root
# user, so a named volume mounted there starts writable. `make images`
# prepares the context and builds it:
#
#	make images                  # make build, then docker build -t jetfabric:latest
#
# The same image runs every part: `broker`, `worker`, `devices`, `demo`,
# `healthcheck` (used by the compose health checks: scratch has no shell).
FROM scratch
COPY --chown=65532:65532 bin/image/data /data
COPY bin/jetfabric /jetfabric
USER 65532:65532
ENV JETFABRIC_STORE=/data
EXPOSE 4222 6222 8222
ENTRYPOINT ["/jetfabric"]
CMD ["help"]
