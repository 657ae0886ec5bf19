# syntax=docker/dockerfile:1

# Production dependencies exactly as package-lock.json pins them (npm ci); the Bun image carries no npm.
# bun is a devDependency: the base image below brings the runtime, so --omit=dev leaves out a second one.
# npm ci's postinstall applies patches/ (patch-package) to the installed drivers and Elysia.
FROM node:22-bookworm-slim AS deps
WORKDIR /app
COPY package.json package-lock.json ./
COPY patches ./patches
RUN npm ci --omit=dev --no-audit --no-fund

FROM oven/bun:1.4.5
WORKDIR /app
# MIMALLOC_PURGE_DELAY=-1 and BUN_CONFIG_MAX_HTTP_REQUESTS=512: src/server-processes.ts's LAUNCH_ENV (the
# allocator keeps its pages, a fifth more validates a second on a virtual machine; webhook deliveries and
# test pings fetch side by side), read by Bun only at its start, so set here.
ENV NODE_ENV=production \
    HOST=0.0.0.0 \
    PORT=3000 \
    DATA_DIR=/data \
    MIMALLOC_PURGE_DELAY=-1 \
    BUN_CONFIG_MAX_HTTP_REQUESTS=512
COPY --from=deps /app/node_modules ./node_modules
# package.json is read at run time (the API version in the OpenAPI document); drizzle/ holds the
# migrations src/main.ts applies at start; bunfig.toml keeps `bun run cli` from echoing its command
# line (an API key given to `apikey revoke`) on stderr.
COPY package.json tsconfig.json bunfig.toml ./
COPY drizzle ./drizzle
COPY src ./src
RUN mkdir -p /data && chown bun:bun /data && chmod 700 /data
USER bun
# The embedded database, the development master key and the operator socket live here.
VOLUME /data
EXPOSE 3000
# GET /healthz on the server's own HOST, PORT and scheme, read from the settings the server reads.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
  CMD ["bun", "src/healthcheck.ts"]
# Exec form: bun itself receives docker stop's SIGTERM (a shell in between would not pass it on) and
# shuts down cleanly; as PID 1 it ignores signals it has no handler for until main.ts installs them.
CMD ["bun", "src/main.ts"]
