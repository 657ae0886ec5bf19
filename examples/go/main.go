// Command license-check is a client of a self-hosted license service, as an application would embed
// it: validate a license for this machine, verify the signed answer with the app's public key, send
// one heartbeat, and check an offline `.authforge` license file. Go 1.19+, standard library only.
//
// Exit codes: 0 the license is good; 1 it was refused or an answer failed verification; 2 bad usage.
package main

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"time"
)

// settings: flag name, environment variable.
var settingNames = [][2]string{
	{"base-url", "LS_BASE_URL"},
	{"app-id", "LS_APP_ID"},
	{"app-secret", "LS_APP_SECRET"},
	{"public-key", "LS_PUBLIC_KEY"},
	{"license-key", "LS_LICENSE_KEY"},
	{"hwid", "LS_HWID"},
	{"offline-file", "LS_OFFLINE_FILE"},
}

// refused: the license was refused, or an answer is not what the server signed for this request (exit 1).
type refused struct{ msg string }

func (e refused) Error() string { return e.msg }

// badUsage: a setting is missing or malformed (exit 2).
type badUsage struct{ msg string }

func (e badUsage) Error() string { return e.msg }

type settings struct {
	values          map[string]string
	keys            []ed25519.PublicKey
	online, offline bool
}

func readSettings(args []string) (*settings, error) {
	fs := flag.NewFlagSet("license-check", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	given := map[string]*string{}
	for _, s := range settingNames {
		given[s[0]] = fs.String(s[0], "", "or "+s[1])
	}
	if err := fs.Parse(args); err != nil {
		return nil, badUsage{err.Error()}
	}
	s := &settings{values: map[string]string{}}
	for _, name := range settingNames {
		value := *given[name[0]]
		if value == "" {
			value = os.Getenv(name[1])
		}
		s.values[name[0]] = strings.TrimSpace(value)
	}
	s.online = s.values["license-key"] != ""
	s.offline = s.values["offline-file"] != ""
	if !s.online && !s.offline {
		return nil, badUsage{"give a license key (online check), an offline file, or both"}
	}
	required := []string{"app-id", "public-key", "hwid"}
	if s.online {
		required = append(required, "base-url", "app-secret")
	}
	var missing []string
	for _, flagName := range required {
		if s.values[flagName] == "" {
			for _, name := range settingNames {
				if name[0] == flagName {
					missing = append(missing, fmt.Sprintf("--%s (%s)", name[0], name[1]))
				}
			}
		}
	}
	if len(missing) > 0 {
		return nil, badUsage{"missing " + strings.Join(missing, ", ")}
	}
	for _, text := range strings.Split(s.values["public-key"], ",") {
		key, err := trustedKey(text)
		if err != nil {
			return nil, err
		}
		s.keys = append(s.keys, key)
	}
	return s, nil
}

// trustedKey reads the app's public key as the Developer API and the CLI give it: the raw 32-byte
// Ed25519 key, standard base64.
func trustedKey(text string) (ed25519.PublicKey, error) {
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(text))
	if err != nil || len(raw) != ed25519.PublicKeySize {
		return nil, badUsage{`a public key must be 32 bytes, base64 (as "publicKey" is given)`}
	}
	return ed25519.PublicKey(raw), nil
}

// signedByTrustedKey: Ed25519 over the UTF-8 bytes of the base64 text exactly as received, by any
// trusted key (rotation).
func signedByTrustedKey(text, signatureB64 string, keys []ed25519.PublicKey) bool {
	signature, err := base64.StdEncoding.DecodeString(signatureB64)
	if err != nil || len(signature) != ed25519.SignatureSize {
		return false
	}
	for _, key := range keys {
		if ed25519.Verify(key, []byte(text), signature) {
			return true
		}
	}
	return false
}

type signedReply struct {
	Status    string `json:"status"`
	Error     string `json:"error"`
	Payload   string `json:"payload"`
	Signature string `json:"signature"`
	KeyID     string `json:"keyId"`
}

type sessionPayload struct {
	SessionToken       string                 `json:"sessionToken"`
	ExpiresIn          int64                  `json:"expiresIn"`
	SessionExpiresAt   string                 `json:"sessionExpiresAt"`
	Nonce              string                 `json:"nonce"`
	AppID              string                 `json:"appId"`
	LicenseKey         string                 `json:"licenseKey"`
	Hwid               string                 `json:"hwid"`
	LicenseExpiresAt   *string                `json:"licenseExpiresAt"`
	UnlimitedHwidSlots bool                   `json:"unlimitedHwidSlots"`
	MaxHwidSlots       int                    `json:"maxHwidSlots"`
	HwidCount          int                    `json:"hwidCount"`
	AppVariables       map[string]interface{} `json:"appVariables"`
	LicenseVariables   map[string]interface{} `json:"licenseVariables"`
}

var client = &http.Client{Timeout: 15 * time.Second}

func post(baseURL, path string, body map[string]string) (*signedReply, error) {
	encoded, _ := json.Marshal(body)
	res, err := client.Post(strings.TrimRight(baseURL, "/")+path, "application/json", bytes.NewReader(encoded))
	if err != nil {
		return nil, refused{fmt.Sprintf("cannot reach %s: %v", baseURL, err)}
	}
	defer res.Body.Close()
	var reply signedReply
	if err := json.NewDecoder(res.Body).Decode(&reply); err != nil {
		reply.Error = "no JSON answer"
	}
	if res.StatusCode >= 400 || reply.Status != "success" {
		return nil, refused{fmt.Sprintf("%s refused: %s (HTTP %d)", path, reply.Error, res.StatusCode)}
	}
	return &reply, nil
}

// openSigned verifies first, then decodes (never parse what is not signed), then checks the nonce echo.
func openSigned(path string, reply *signedReply, keys []ed25519.PublicKey, nonce string) (*sessionPayload, error) {
	if !signedByTrustedKey(reply.Payload, reply.Signature, keys) {
		return nil, refused{fmt.Sprintf("%s: the signature does not verify with the app's public key (keyId %s)", path, reply.KeyID)}
	}
	decoded, err := base64.StdEncoding.DecodeString(reply.Payload)
	var p sessionPayload
	if err == nil {
		err = json.Unmarshal(decoded, &p)
	}
	if err != nil {
		return nil, refused{fmt.Sprintf("%s: the signed payload is not JSON", path)}
	}
	if p.Nonce != nonce {
		return nil, refused{fmt.Sprintf("%s: the nonce is not ours (a replayed answer?)", path)}
	}
	if p.ExpiresIn <= time.Now().Unix() {
		return nil, refused{fmt.Sprintf("%s: the session has already expired", path)}
	}
	return &p, nil
}

func newNonce() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

func compactJSON(v interface{}) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func checkOnline(s *settings) error {
	v := s.values
	nonce := newNonce()
	reply, err := post(v["base-url"], "/auth/validate", map[string]string{
		"appId": v["app-id"], "appSecret": v["app-secret"], "licenseKey": v["license-key"], "hwid": v["hwid"], "nonce": nonce,
	})
	if err != nil {
		return err
	}
	session, err := openSigned("/auth/validate", reply, s.keys, nonce)
	if err != nil {
		return err
	}
	if session.AppID != v["app-id"] || session.LicenseKey != v["license-key"] || session.Hwid != v["hwid"] {
		return refused{"/auth/validate: the signed payload is for another app, license or machine"}
	}
	licenseExpires := "never"
	if session.LicenseExpiresAt != nil {
		licenseExpires = *session.LicenseExpiresAt
	}
	seats := fmt.Sprintf("seat %d of %d", session.HwidCount, session.MaxHwidSlots)
	if session.UnlimitedHwidSlots {
		seats = "unlimited seats"
	}
	fmt.Printf("validate: ok, license %s (expires %s), %s, session until %s, signed by %s\n",
		session.LicenseKey, licenseExpires, seats, session.SessionExpiresAt, reply.KeyID)
	fmt.Printf("variables: app %s, license %s\n", compactJSON(session.AppVariables), compactJSON(session.LicenseVariables))

	heartbeatNonce := newNonce()
	heartbeat, err := post(v["base-url"], "/auth/heartbeat", map[string]string{
		"appId": v["app-id"], "sessionToken": session.SessionToken, "hwid": v["hwid"], "nonce": heartbeatNonce,
	})
	if err != nil {
		return err
	}
	renewed, err := openSigned("/auth/heartbeat", heartbeat, s.keys, heartbeatNonce)
	if err != nil {
		return err
	}
	fmt.Printf("heartbeat: ok, session until %s\n", renewed.SessionExpiresAt)
	return nil
}

var (
	base64Text = regexp.MustCompile(`^[A-Za-z0-9+/]+={0,2}$`)
	whitespace = regexp.MustCompile(`\s+`)
)

// parseLicenseFile returns the armored file's payload and signature, or ok false. It tolerates CRLF,
// a BOM, re-wrapped lines and text around the armor.
func parseLicenseFile(text string) (payload, signature string, ok bool) {
	text = strings.TrimPrefix(text, "\uFEFF")
	text = strings.ReplaceAll(strings.ReplaceAll(text, "\r\n", "\n"), "\r", "\n")
	lines := strings.Split(text, "\n")
	find := func(marker string, from int) int {
		for i := from; from >= 0 && i < len(lines); i++ {
			if strings.TrimSpace(lines[i]) == marker {
				return i
			}
		}
		return -1
	}
	begin := find("-----BEGIN AUTHFORGE LICENSE-----", 0)
	end := find("-----END AUTHFORGE LICENSE-----", next(begin))
	sigBegin := find("-----BEGIN AUTHFORGE SIGNATURE-----", next(end))
	sigEnd := find("-----END AUTHFORGE SIGNATURE-----", next(sigBegin))
	if sigEnd < 0 {
		return "", "", false
	}
	block := lines[begin+1 : end]
	blank := -1
	for i, line := range block {
		if strings.TrimSpace(line) == "" {
			blank = i
			break
		}
	}
	if blank < 0 {
		return "", "", false
	}
	for _, line := range block[:blank] {
		if strings.Index(line, ":") <= 0 {
			return "", "", false
		}
	}
	payload = whitespace.ReplaceAllString(strings.Join(block[blank+1:], ""), "")
	signature = whitespace.ReplaceAllString(strings.Join(lines[sigBegin+1:sigEnd], ""), "")
	return payload, signature, base64Text.MatchString(payload) && base64Text.MatchString(signature)
}

// next is the line after index i, or -1 (nothing to search) when i was not found.
func next(i int) int {
	if i < 0 {
		return -1
	}
	return i + 1
}

func nonEmpty(v interface{}) bool {
	s, ok := v.(string)
	return ok && s != ""
}

// verifyLicenseFile gives the SDKs' verdict on a file, in their fixed order, and the payload when it is "ok".
func verifyLicenseFile(text, appID string, keys []ed25519.PublicKey, hwid string, now time.Time) (string, map[string]interface{}) {
	payloadB64, signature, ok := parseLicenseFile(text)
	if !ok {
		return "bad_armor", nil
	}
	if !signedByTrustedKey(payloadB64, signature, keys) {
		return "bad_signature", nil
	}
	decoded, err := base64.StdEncoding.DecodeString(payloadB64)
	var p map[string]interface{}
	if err != nil || json.Unmarshal(decoded, &p) != nil || p == nil {
		return "malformed_payload", nil
	}
	if version, isNumber := p["v"].(float64); !isNumber || version != 1 {
		return "unsupported_version", nil
	}
	policy, _ := p["hwid"].(map[string]interface{})
	mode, _ := policy["mode"].(string)
	hwids, _ := policy["hwids"].([]interface{})
	policyOK := mode == "any" || (mode == "bound" && len(hwids) > 0)
	for _, h := range hwids {
		policyOK = policyOK && nonEmpty(h)
	}
	shaped := p["typ"] == "authforge-license" && policyOK
	for _, field := range []string{"appId", "licenseKey", "jti", "kid", "issuedAt"} {
		shaped = shaped && nonEmpty(p[field])
	}
	expiresAt, present := p["expiresAt"]
	if !shaped || !present || (expiresAt != nil && !nonEmpty(expiresAt)) {
		return "malformed_payload", nil
	}
	if p["appId"] != appID {
		return "wrong_app", nil
	}
	if expiresAt != nil {
		expires, err := time.Parse(time.RFC3339Nano, expiresAt.(string))
		if err != nil || !expires.After(now) {
			return "expired", nil
		}
	}
	if mode == "bound" {
		bound := false
		for _, h := range hwids {
			bound = bound || h == hwid
		}
		if !bound {
			return "hwid_mismatch", nil
		}
	}
	return "ok", p
}

func checkOffline(s *settings) error {
	text, err := os.ReadFile(s.values["offline-file"])
	if err != nil {
		return badUsage{fmt.Sprintf("cannot read the offline file: %v", err)}
	}
	code, p := verifyLicenseFile(string(text), s.values["app-id"], s.keys, s.values["hwid"], time.Now())
	if code != "ok" {
		return refused{"offline file refused: " + code}
	}
	expires := "never"
	if e, isText := p["expiresAt"].(string); isText {
		expires = e
	}
	machines := "any machine"
	if hwids, bound := p["hwid"].(map[string]interface{})["hwids"].([]interface{}); bound {
		machines = fmt.Sprintf("this machine (1 of %d bound)", len(hwids))
	}
	fmt.Printf("offline file: ok, license %s, file expires %s, valid on %s\n", p["licenseKey"], expires, machines)
	return nil
}

func run(args []string) error {
	s, err := readSettings(args)
	if err != nil {
		return err
	}
	if s.online {
		if err := checkOnline(s); err != nil {
			return err
		}
	}
	if s.offline {
		if err := checkOffline(s); err != nil {
			return err
		}
	}
	fmt.Println("license: good")
	return nil
}

func main() {
	err := run(os.Args[1:])
	if err == nil {
		return
	}
	fmt.Fprintf(os.Stderr, "license check failed: %v\n", err)
	if errors.As(err, new(badUsage)) {
		fmt.Fprintln(os.Stderr, "flags: --base-url --app-id --app-secret --public-key --license-key --hwid --offline-file (or LS_* variables)")
		os.Exit(2)
	}
	os.Exit(1)
}
