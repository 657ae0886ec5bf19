# syntax=docker/dockerfile:1

# Production dependencies exactly as package-lock.json pins them (npm ci); the Bun image carries no npm.
FROM node:22-bookworm-slim AS deps
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --no-audit --no-fund

FROM oven/bun:1.4.5
WORKDIR /app
ENV NODE_ENV=production \
    HOST=0.0.0.0 \
    PORT=3000 \
    DATA_DIR=/data
COPY --from=deps /app/node_modules ./node_modules
# package.json is read at run time (the API version in the OpenAPI document); drizzle/ holds the
# migrations src/main.ts applies at start.
COPY package.json tsconfig.json ./
COPY drizzle ./drizzle
COPY src ./src
RUN mkdir -p /data && chown bun:bun /data
USER bun
# The embedded database, the development master key and the operator socket live here.
VOLUME /data
EXPOSE 3000
# HTTPS when TLS_CERT_FILE is set; the certificate names the public host, not 127.0.0.1, so it is not checked.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s \
  CMD bun -e "const e = process.env; fetch((e.TLS_CERT_FILE ? 'https' : 'http') + '://127.0.0.1:' + (e.PORT || 3000) + '/healthz', { tls: { rejectUnauthorized: false } }).then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))"
CMD ["bun", "src/main.ts"]
