// Preloaded by bun test (bunfig.toml). test/run.ts sets TEST_DATABASE_URL and TEST_REDIS_URL for the
// PostgreSQL + Redis pass; without them the suite runs on embedded PGlite and the in-process store.
import { SERVICE_SETTINGS } from './support/service-settings'

// A shell set up to run the service (the README exports these for production) must not point the
// servers the tests start at its database, its Redis or its key: each test says what it runs on.
for (const name of SERVICE_SETTINGS) delete process.env[name]
process.env.WEBHOOK_ALLOW_PRIVATE_TARGETS ??= 'true'
process.env.LOG_LEVEL ??= 'error'
