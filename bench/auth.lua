-- wrk script for the benchmark: POST bodies for /auth/validate, /auth/heartbeat or the baseline route.
-- Arguments: <mode> <data file> <run id>. The data file's first line is "<appId> <appSecret>", then one
-- "<licenseKey> <hwid> <sessionToken>" per license (HWIDs already bound). Every validate carries a
-- nonce unique across threads and runs: run id, thread id, per-thread counter.
local threads = 0

function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end

function init(args)
  mode = args[1]
  run = args[3]
  rows = {}
  counter = 0
  local first = true
  for line in io.lines(args[2]) do
    if first then
      appId, appSecret = line:match("^(%S+) (%S+)$")
      first = false
    else
      local key, hwid, token = line:match("^(%S+) (%S+) (%S+)$")
      rows[#rows + 1] = { key = key, hwid = hwid, token = token }
    end
  end
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
end

function request()
  counter = counter + 1
  if mode == "baseline" then
    return wrk.format(nil, "/echo", nil, '{"name":"bench","n":' .. counter .. '}')
  end
  local r = rows[(counter * 7 + (tid or 0) * 131) % #rows + 1]
  local nonce = string.format("%s%02x%012x", run, tid or 0, counter)
  local body
  if mode == "validate" then
    body = string.format('{"appId":"%s","appSecret":"%s","licenseKey":"%s","hwid":"%s","nonce":"%s"}',
      appId, appSecret, r.key, r.hwid, nonce)
    return wrk.format(nil, "/auth/validate", nil, body)
  end
  body = string.format('{"appId":"%s","sessionToken":"%s","hwid":"%s","nonce":"%s"}', appId, r.token, r.hwid, nonce)
  return wrk.format(nil, "/auth/heartbeat", nil, body)
end
