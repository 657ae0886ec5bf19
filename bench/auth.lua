-- wrk script for the benchmark: POST bodies for /auth/validate, /auth/heartbeat or the baseline route.
-- Arguments: <mode> <data file> <run id>. The data file's first line is "<appId> <appSecret>", then one
-- "<licenseKey> <hwid> <sessionToken>" per license (HWIDs already bound). Every validate carries a
-- nonce unique across threads and runs: run id, thread id, per-thread counter.
-- Each license's request text up to the nonce is built once in init: wrk and the server share two
-- cores, so Lua work per request would be taken from the server. Per request only the nonce (and the
-- baseline's counter) is formatted; the bytes sent are the same as wrk.format would build.
local threads = 0

function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end

-- Request line and headers up to the Content-Length value; wrk.format sends Host without the port.
local function head(path)
  return "POST " .. path .. " HTTP/1.1\r\nHost: " .. wrk.host .. "\r\nContent-Type: application/json\r\nContent-Length: "
end

function init(args)
  mode = args[1]
  local run = args[3]
  counter = 0
  baseHead = head("/echo")
  -- Fixed width (run id, 2 hex digits of thread id, 12 of counter), so Content-Length is known upfront.
  noncePrefix = string.format("%s%02x", run, tid or 0)
  local nonceLen = #noncePrefix + 12
  prefixes = {}
  local first = true
  for line in io.lines(args[2]) do
    if first then
      appId, appSecret = line:match("^(%S+) (%S+)$")
      first = false
    else
      local key, hwid, token = line:match("^(%S+) (%S+) (%S+)$")
      local body
      if mode == "validate" then
        body = string.format('{"appId":"%s","appSecret":"%s","licenseKey":"%s","hwid":"%s","nonce":"',
          appId, appSecret, key, hwid)
        prefixes[#prefixes + 1] = head("/auth/validate") .. (#body + nonceLen + 2) .. "\r\n\r\n" .. body
      else
        body = string.format('{"appId":"%s","sessionToken":"%s","hwid":"%s","nonce":"', appId, token, hwid)
        prefixes[#prefixes + 1] = head("/auth/heartbeat") .. (#body + nonceLen + 2) .. "\r\n\r\n" .. body
      end
    end
  end
  rowCount = #prefixes
end

function request()
  counter = counter + 1
  if mode == "baseline" then
    local body = '{"name":"bench","n":' .. counter .. '}'
    return baseHead .. #body .. "\r\n\r\n" .. body
  end
  return prefixes[(counter * 7 + (tid or 0) * 131) % rowCount + 1] .. noncePrefix .. string.format("%012x", counter) .. '"}'
end
