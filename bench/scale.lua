-- wrk script for bench/scale.ts: /auth/validate for a license picked at random among the `count` of a
-- bulk set (bench/seed.ts seedBulk: key <prefix>-0000-0000-0000 numbered from 0, HWID h<i> bound).
-- Arguments: <appId> <appSecret> <prefix> <count> <run id>. Every request carries a nonce unique across
-- threads and runs. Both scenarios run this same script, so wrk's own cost is the same on both sides.
local threads = 0

function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end

function init(args)
  appId, appSecret, prefix, count, run = args[1], args[2], args[3], tonumber(args[4]), args[5]
  counter = 0
  math.randomseed(os.time() * 1000 + (tid or 0))
  noncePrefix = string.format("%s%02x", run, tid or 0)
  head = "POST /auth/validate HTTP/1.1\r\nHost: " .. wrk.host .. "\r\nContent-Type: application/json\r\nContent-Length: "
  bodyStart = '{"appId":"' .. appId .. '","appSecret":"' .. appSecret .. '","licenseKey":"' .. prefix .. "-"
end

function request()
  counter = counter + 1
  local i = math.random(0, count - 1)
  local n = string.format("%012d", i)
  local body = bodyStart .. n:sub(1, 4) .. "-" .. n:sub(5, 8) .. "-" .. n:sub(9, 12) .. '","hwid":"h' .. i
    .. '","nonce":"' .. noncePrefix .. string.format("%012x", counter) .. '"}'
  return head .. #body .. "\r\n\r\n" .. body
end
