// Preloaded by bun test (bunfig.toml). test/run.ts sets TEST_DATABASE_URL and TEST_REDIS_URL for the
// PostgreSQL + Redis pass; without them the suite runs on embedded PGlite and the in-process store.
process.env.WEBHOOK_ALLOW_PRIVATE_TARGETS ??= 'true'
process.env.LOG_LEVEL ??= 'error'
