// Package channelconfig reads the channels a worker serves from a TOML file and builds their routes:
// the client (one adapter package per kind), the mode and the contract. Each kind registers itself
// from its own file (http.go, webhook.go, webpush.go, smtp.go, ...; see kind.go): its keys, the modes
// its protocol supports and its client; this file holds what every kind shares.
//
//	[channels.push]
//	kind = "http"                 # one of Kinds(): http, webhook, webpush, smtp, ...
//	mode = "idempotent"           # idempotent | queryable | none
//	url = "https://push.internal.example"
//	ca_file = "/etc/notifier/ca.pem"
//	idempotency_window = "24h"    # idempotent only: how long the provider remembers a key
//	query_settle = "30s"          # queryable only: how long a query may miss a fresh message
//	max_in_flight_age = "1h"      # park a task uncertain for longer than this
//	server_errors_uncertain = false
//	rate_limit = "50/s"           # calls per s, min or h, shared by every worker (any kind)
//	burst = 10                    # calls that may go out at once (default: one second's worth, at least 1)
//
// The kinds whose destination a user supplies (webhook, webpush) refuse internal addresses when
// dialling (service/httpkit, Egress); their allowed_networks key opts networks in:
//
//	allowed_networks = ["10.20.0.0/16", "fd00:1::/64"]   # webhook, webpush: a private receiver
//
// Everything is checked when the file is loaded, so a worker refuses to start rather than fail on
// its first task: unknown keys, keys that do not apply to the channel's kind, a mode that claims more
// than the kind's protocol offers (a webhook cannot be queried; Web Push and SMTP have neither keys
// nor queries), and secrets written into the file. Secrets come only from the environment or from
// files (password_env / password_file, secret_env / secret_file, vapid_private_key_env /
// vapid_private_key_file); they never appear in an error. Relative file names are relative to the
// configuration file's directory.
package channelconfig

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/httpkit"
)

// channel is the part of a [channels.NAME] table every kind reads: the kind, the mode, the contract
// and the rate limit. The rest of the table is the kind's own (see kind.go), decoded by the kind.
type channel struct {
	Kind string `toml:"kind"`
	Mode string `toml:"mode"`

	MaxInFlightAge        string `toml:"max_in_flight_age"`
	ServerErrorsUncertain bool   `toml:"server_errors_uncertain"`

	RateLimit string `toml:"rate_limit"`
	Burst     *int64 `toml:"burst"`

	// Contract keys only some kinds accept (kind.contractKeys).
	IdempotencyWindow  string `toml:"idempotency_window"`
	QuerySettle        string `toml:"query_settle"`
	ResendWithTopic    bool   `toml:"resend_with_topic"`
	ResendWithCollapse bool   `toml:"resend_with_collapse"`
}

type file struct {
	Channels map[string]toml.Primitive `toml:"channels"`
}

// common keys every kind accepts.
var common = []string{"kind", "mode", "max_in_flight_age", "server_errors_uncertain", "rate_limit", "burst"}

// contractKeys are the keys of channel that a kind accepts only when it lists them.
var contractKeys = []string{"idempotency_window", "query_settle", "resend_with_topic", "resend_with_collapse"}

// inlineSecrets are keys that would put a secret into the file, and where it must come from instead.
var inlineSecrets = map[string]string{
	"password":          "password_env/password_file",
	"secret":            "secret_env/secret_file",
	"vapid_private_key": "vapid_private_key_env/vapid_private_key_file",
	"private_key":       "vapid_private_key_env/vapid_private_key_file",
	"token":             "an _env or _file key",
	"server_token":      "server_token_env/server_token_file",
	"api_key":           "an _env or _file key",
}

var channelName = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,31}$`)

// Error is a configuration the worker refuses. It matches service.ErrInvalidInput.
type Error struct{ msg string }

func (e *Error) Error() string        { return e.msg }
func (e *Error) Is(target error) bool { return target == delivery.ErrInvalidInput }

func fail(format string, args ...any) error {
	return &Error{msg: delivery.OneLine(fmt.Sprintf(format, args...), 10000)}
}

// Load reads and checks the file and builds one route per channel. getenv resolves *_env keys
// (os.Getenv in production). Errors are *Error, one line naming the file, the channel and the key.
func Load(path string, getenv func(string) string) (map[string]delivery.Route, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fail("channels file: %v", err)
	}
	var f file
	md, err := toml.Decode(string(data), &f)
	if err != nil {
		return nil, fail("%s: %v", path, err)
	}
	if err := checkInlineSecrets(md); err != nil {
		return nil, fail("%s: %v", path, err)
	}
	if len(f.Channels) == 0 {
		if err := checkUndecoded(md, nil); err != nil {
			return nil, fail("%s: %v", path, err)
		}
		return nil, fail("%s: no [channels.NAME] table", path)
	}
	names := make([]string, 0, len(f.Channels))
	for name := range f.Channels {
		names = append(names, name)
	}
	sort.Strings(names)
	// Decode every table first, so that a key the file gets wrong is reported before a route is built.
	tables := make(map[string]table, len(names))
	for _, name := range names {
		t, err := decode(md, f.Channels[name])
		if err != nil {
			return nil, fail("%s: channel %q: %v", path, name, err)
		}
		tables[name] = t
	}
	if err := checkUndecoded(md, tables); err != nil {
		return nil, fail("%s: %v", path, err)
	}
	l := loader{dir: filepath.Dir(path), getenv: getenv}
	routes := make(map[string]delivery.Route, len(names))
	for _, name := range names {
		r, err := l.route(name, tables[name])
		if err != nil {
			return nil, fail("%s: channel %q: %v", path, name, err)
		}
		routes[name] = r
	}
	return routes, nil
}

// table is one decoded [channels.NAME] table: the common part, its kind, and the kind's own part,
// ready to build a client from.
type table struct {
	channel
	kind   kind
	client func(l loader) (delivery.Channel, error)
	finish contractFinisher // nil: the kind's own keys leave the contract alone
}

// decode reads a table's common part, finds its kind and lets the kind decode the rest.
func decode(md toml.MetaData, p toml.Primitive) (table, error) {
	var t table
	if err := md.PrimitiveDecode(p, &t.channel); err != nil {
		return t, err
	}
	k, ok := kinds[t.Kind]
	if !ok {
		if t.Kind == "" {
			return t, fmt.Errorf("kind: required (want %s)", kindList())
		}
		return t, fmt.Errorf("kind %q: want %s", t.Kind, kindList())
	}
	t.kind = k
	client, finish, err := k.decode(md, p)
	if err != nil {
		return t, err
	}
	t.client, t.finish = client, finish
	return t, nil
}

// checkInlineSecrets refuses a key that would put a secret into the file.
func checkInlineSecrets(md toml.MetaData) error {
	for _, key := range md.Keys() {
		if len(key) == 3 && key[0] == "channels" {
			if hint, ok := inlineSecrets[key[2]]; ok {
				return fmt.Errorf("channel %q: %s: secrets only from %s, never inline", key[1], key[2], hint)
			}
		}
	}
	return nil
}

// checkUndecoded refuses keys no part of the table read: unknown keys, and keys of another kind. A
// contract key the table's kind does not list is refused too, though the common part decoded it.
func checkUndecoded(md toml.MetaData, tables map[string]table) error {
	if undecoded := md.Undecoded(); len(undecoded) > 0 { // the first one is enough to refuse the file
		key := undecoded[0]
		if len(key) == 3 && key[0] == "channels" {
			name, k := key[1], key[2]
			if owner := kindsWithKey(k); owner != "" {
				return fmt.Errorf("channel %q: %s does not apply to kind %q (it is a key of %s)", name, k, tables[name].Kind, owner)
			}
			return fmt.Errorf("channel %q: unknown key %q", name, k)
		}
		return fmt.Errorf("unknown key %q", key.String())
	}
	for _, key := range md.Keys() {
		if len(key) != 3 || key[0] != "channels" || !slices.Contains(contractKeys, key[2]) {
			continue
		}
		t := tables[key[1]]
		if !slices.Contains(t.kind.contractKeys, key[2]) {
			return fmt.Errorf("channel %q: %s does not apply to kind %q", key[1], key[2], t.Kind)
		}
	}
	return nil
}

type loader struct {
	dir    string
	getenv func(string) string
	// channelContract is the channel's contract, set before its client is built: an adapter whose
	// requests depend on it (collapse keys only with resend_with_collapse) reads it.
	channelContract delivery.Contract
}

func (l loader) route(name string, t table) (delivery.Route, error) {
	if !channelName.MatchString(name) {
		return delivery.Route{}, errors.New("invalid name: want 1-32 of a-z, 0-9, _ or -, starting with a letter")
	}
	mode, err := l.mode(t)
	if err != nil {
		return delivery.Route{}, err
	}
	contract, err := l.contract(t.channel, mode)
	if err != nil {
		return delivery.Route{}, err
	}
	if contract, err = withDefaults(contract, mode, t.kind); err != nil {
		return delivery.Route{}, err
	}
	if t.finish != nil {
		if contract, err = t.finish(mode, contract); err != nil {
			return delivery.Route{}, err
		}
	}
	limit, err := rateLimit(t.channel)
	if err != nil {
		return delivery.Route{}, err
	}
	l.channelContract = contract
	client, err := t.client(l)
	if err != nil {
		return delivery.Route{}, err
	}
	return delivery.Route{Mode: mode, Contract: contract, Client: client, RateLimit: limit}, nil
}

// rateLimit reads rate_limit ("50/s", "3000/min", "20000/h") and burst (a whole number of calls, by
// default one second's worth and at least one).
func rateLimit(c channel) (delivery.RateLimit, error) {
	if c.RateLimit == "" {
		if c.Burst != nil {
			return delivery.RateLimit{}, errors.New("burst: applies only with rate_limit")
		}
		return delivery.RateLimit{}, nil
	}
	rate, err := delivery.ParseRate(c.RateLimit)
	if err != nil {
		var bad *delivery.InputError
		if errors.As(err, &bad) {
			err = errors.New("rate_limit " + bad.Reason)
		}
		return delivery.RateLimit{}, err
	}
	limit := delivery.RateLimit{PerSecond: rate, Burst: delivery.DefaultBurst(rate)}
	if c.Burst != nil {
		if *c.Burst < 1 || *c.Burst > delivery.MaxRate {
			return delivery.RateLimit{}, fmt.Errorf("burst %d: want a whole number of calls from 1 to %d", *c.Burst, delivery.MaxRate)
		}
		limit.Burst = float64(*c.Burst)
	}
	return limit, nil
}

func (l loader) mode(t table) (delivery.Mode, error) {
	modes := t.kind.modes
	if t.Mode == "" {
		if t.kind.modeRequired {
			return "", fmt.Errorf("mode: required for kind %s (%s)", t.Kind, t.kind.offers)
		}
		return modes[0], nil
	}
	m, err := delivery.ParseMode(t.Mode)
	if err != nil {
		return "", fmt.Errorf("mode %q: want idempotent, queryable or none", t.Mode)
	}
	if !slices.Contains(modes, m) {
		return "", fmt.Errorf("mode %q: kind %s %s", t.Mode, t.Kind, t.kind.offers)
	}
	return m, nil
}

func (l loader) contract(c channel, mode delivery.Mode) (delivery.Contract, error) {
	var k delivery.Contract
	var err error
	if k.IdempotencyWindow, err = duration("idempotency_window", c.IdempotencyWindow); err != nil {
		return k, err
	}
	if k.QuerySettle, err = duration("query_settle", c.QuerySettle); err != nil {
		return k, err
	}
	if k.MaxInFlightAge, err = duration("max_in_flight_age", c.MaxInFlightAge); err != nil {
		return k, err
	}
	if c.IdempotencyWindow != "" && mode != delivery.ModeIdempotent {
		return k, fmt.Errorf("idempotency_window applies to mode idempotent only, not %s", strings.ToLower(string(mode)))
	}
	if c.QuerySettle != "" && mode != delivery.ModeQueryable {
		return k, fmt.Errorf("query_settle applies to mode queryable only, not %s", strings.ToLower(string(mode)))
	}
	k.ServerErrorsUncertain = c.ServerErrorsUncertain
	k.ResendWithTopic = c.ResendWithTopic || c.ResendWithCollapse
	return k, nil
}

// withDefaults fills in what the kind's provider documents (kind.defaults) and refuses a file that
// claims a longer memory of keys than the provider has.
func withDefaults(k delivery.Contract, mode delivery.Mode, kd kind) (delivery.Contract, error) {
	d := kd.defaults
	if w := d.IdempotencyWindow; w > 0 && mode == delivery.ModeIdempotent {
		if k.IdempotencyWindow > w {
			return k, fmt.Errorf("idempotency_window %s: kind %s keeps idempotency keys %s at most", k.IdempotencyWindow, kd.name, w)
		}
		if k.IdempotencyWindow == 0 {
			k.IdempotencyWindow = w
		}
	}
	if d.QuerySettle > 0 && mode == delivery.ModeQueryable && k.QuerySettle == 0 {
		k.QuerySettle = d.QuerySettle
	}
	if m := d.MaxInFlightAge; m > 0 && mode == delivery.ModeQueryable {
		// The provider's search keeps messages this long: a "not found" after it proves nothing.
		if k.MaxInFlightAge > m {
			return k, fmt.Errorf("max_in_flight_age %s: kind %s can be queried for %s at most", k.MaxInFlightAge, kd.name, m)
		}
		if k.MaxInFlightAge == 0 {
			k.MaxInFlightAge = m
		}
	}
	k.ServerErrorsUncertain = k.ServerErrorsUncertain || d.ServerErrorsUncertain
	k.ThrottleRefuses = d.ThrottleRefuses
	return k, nil
}

func duration(key, s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%s %q: want a positive duration such as \"30s\", \"15m\" or \"24h\"", key, s)
	}
	return d, nil
}

// secret reads a secret from exactly one of NAME_env and NAME_file. Errors name the variable or
// file, never the value.
func (l loader) secret(name, env, file string) (string, error) {
	// Ifs rather than a tagless switch, whose case expressions coverage profiles (and so
	// `just mutants`) do not count as statements.
	if env != "" && file != "" {
		return "", fmt.Errorf("%s_env and %s_file: give one, not both", name, name)
	}
	if env != "" {
		v := l.getenv(env)
		if strings.TrimSpace(v) == "" {
			return "", fmt.Errorf("%s_env: environment variable %s is unset or empty", name, env)
		}
		return strings.TrimRight(v, "\r\n"), nil
	}
	if file != "" {
		b, err := os.ReadFile(l.path(file))
		if err != nil {
			return "", fmt.Errorf("%s_file: %w", name, err)
		}
		v := strings.TrimRight(string(b), "\r\n")
		if strings.TrimSpace(v) == "" {
			return "", fmt.Errorf("%s_file: %s is empty", name, l.path(file))
		}
		return v, nil
	}
	return "", fmt.Errorf("%s_env or %s_file: required", name, name)
}

// allowedNetworks reads the allowed_networks key of the kinds with user-supplied destinations.
func allowedNetworks(cidrs []string) ([]netip.Prefix, error) {
	nets, err := httpkit.ParseNetworks(cidrs)
	return nets, keyErr("allowed_networks", err)
}

func (l loader) path(p string) string {
	if p == "" || filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(l.dir, p)
}

// keyErr prefixes a constructor's error with the key it concerns.
func keyErr(key string, err error) error {
	if err == nil {
		return nil
	}
	msg := strings.TrimPrefix(err.Error(), delivery.ErrInvalidInput.Error()+": ")
	if key == "" {
		return errors.New(msg)
	}
	return fmt.Errorf("%s: %s", key, msg)
}
