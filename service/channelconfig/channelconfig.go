// Package channelconfig reads the channels a worker serves from a TOML file and builds their routes:
// the client (service/httpchannel, webhook, webpush or smtpchannel), the mode and the contract.
//
//	[channels.push]
//	kind = "http"                 # http | webhook | webpush | smtp
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
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/notifierhq/notifier/service/delivery"
	"github.com/notifierhq/notifier/service/httpchannel"
	"github.com/notifierhq/notifier/service/smtpchannel"
	"github.com/notifierhq/notifier/service/webhook"
	"github.com/notifierhq/notifier/service/webpush"
)

// Kinds of channel.
const (
	KindHTTP    = "http"
	KindWebhook = "webhook"
	KindWebPush = "webpush"
	KindSMTP    = "smtp"
)

// channel is one [channels.NAME] table. Fields a kind does not use are refused (see keysByKind).
type channel struct {
	Kind string `toml:"kind"`
	Mode string `toml:"mode"`

	URL    string `toml:"url"`
	CAFile string `toml:"ca_file"`

	IdempotencyWindow     string `toml:"idempotency_window"`
	QuerySettle           string `toml:"query_settle"`
	MaxInFlightAge        string `toml:"max_in_flight_age"`
	ServerErrorsUncertain bool   `toml:"server_errors_uncertain"`
	ResendWithTopic       bool   `toml:"resend_with_topic"`

	RateLimit string `toml:"rate_limit"`
	Burst     *int64 `toml:"burst"`

	// smtp
	Addr            string `toml:"addr"`
	StartTLS        string `toml:"starttls"`
	Username        string `toml:"username"`
	PasswordEnv     string `toml:"password_env"`
	PasswordFile    string `toml:"password_file"`
	From            string `toml:"from"`
	HeloName        string `toml:"helo_name"`
	MessageIDDomain string `toml:"message_id_domain"`
	SubjectPrefix   string `toml:"subject_prefix"`

	// webhook
	SecretEnv  string `toml:"secret_env"`
	SecretFile string `toml:"secret_file"`

	// webpush
	VAPIDPrivateKeyEnv  string `toml:"vapid_private_key_env"`
	VAPIDPrivateKeyFile string `toml:"vapid_private_key_file"`
	VAPIDSubject        string `toml:"vapid_subject"`
	Urgency             string `toml:"urgency"`
}

type file struct {
	Channels map[string]channel `toml:"channels"`
}

// common keys every kind accepts.
var common = []string{"kind", "mode", "max_in_flight_age", "server_errors_uncertain", "rate_limit", "burst"}

// keysByKind lists the keys each kind accepts besides the common ones.
var keysByKind = map[string][]string{
	KindHTTP:    {"url", "ca_file", "idempotency_window", "query_settle"},
	KindWebhook: {"ca_file", "idempotency_window", "secret_env", "secret_file"},
	KindWebPush: {"ca_file", "resend_with_topic", "vapid_private_key_env", "vapid_private_key_file", "vapid_subject", "urgency"},
	KindSMTP: {"addr", "ca_file", "starttls", "username", "password_env", "password_file", "from", "helo_name",
		"message_id_domain", "subject_prefix"},
}

// modesByKind lists the modes each kind's protocol supports, the default first. Claiming less than
// the protocol offers is allowed (a webhook may be run as NONE); claiming more is not.
var modesByKind = map[string][]delivery.Mode{
	KindHTTP:    {delivery.ModeIdempotent, delivery.ModeQueryable, delivery.ModeNone}, // no default: the endpoint decides
	KindWebhook: {delivery.ModeIdempotent, delivery.ModeNone},
	KindWebPush: {delivery.ModeNone},
	KindSMTP:    {delivery.ModeNone},
}

// inlineSecrets are keys that would put a secret into the file, and where it must come from instead.
var inlineSecrets = map[string]string{
	"password":          "password_env/password_file",
	"secret":            "secret_env/secret_file",
	"vapid_private_key": "vapid_private_key_env/vapid_private_key_file",
	"private_key":       "vapid_private_key_env/vapid_private_key_file",
	"token":             "an _env or _file key",
	"api_key":           "an _env or _file key",
}

var channelName = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,31}$`)

// Error is a configuration the worker refuses. It matches service.ErrInvalidInput.
type Error struct{ msg string }

func (e *Error) Error() string        { return e.msg }
func (e *Error) Is(target error) bool { return target == delivery.ErrInvalidInput }

func fail(format string, args ...any) error {
	return &Error{msg: oneLine(fmt.Sprintf(format, args...))}
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
	if err := checkKeys(md, f); err != nil {
		return nil, fail("%s: %v", path, err)
	}
	if len(f.Channels) == 0 {
		return nil, fail("%s: no [channels.NAME] table", path)
	}
	names := make([]string, 0, len(f.Channels))
	for name := range f.Channels {
		names = append(names, name)
	}
	sort.Strings(names)
	l := loader{dir: filepath.Dir(path), getenv: getenv}
	routes := make(map[string]delivery.Route, len(names))
	for _, name := range names {
		r, err := l.route(name, f.Channels[name])
		if err != nil {
			return nil, fail("%s: channel %q: %v", path, name, err)
		}
		routes[name] = r
	}
	return routes, nil
}

// checkKeys refuses unknown keys, keys of another kind, and inline secrets.
func checkKeys(md toml.MetaData, f file) error {
	for _, key := range md.Keys() {
		if len(key) == 3 && key[0] == "channels" {
			if hint, ok := inlineSecrets[key[2]]; ok {
				return fmt.Errorf("channel %q: %s: secrets only from %s, never inline", key[1], key[2], hint)
			}
		}
	}
	for _, key := range md.Undecoded() {
		if len(key) == 3 && key[0] == "channels" {
			return fmt.Errorf("channel %q: unknown key %q", key[1], key[2])
		}
		return fmt.Errorf("unknown key %q", key.String())
	}
	for _, key := range md.Keys() {
		if len(key) != 3 || key[0] != "channels" {
			continue
		}
		name, k := key[1], key[2]
		kind := f.Channels[name].Kind
		allowed, known := keysByKind[kind]
		if !known || slices.Contains(common, k) || slices.Contains(allowed, k) {
			continue // an unknown kind is reported with the channel
		}
		return fmt.Errorf("channel %q: %s does not apply to kind %q", name, k, kind)
	}
	return nil
}

type loader struct {
	dir    string
	getenv func(string) string
}

func (l loader) route(name string, c channel) (delivery.Route, error) {
	if !channelName.MatchString(name) {
		return delivery.Route{}, errors.New("invalid name: want 1-32 of a-z, 0-9, _ or -, starting with a letter")
	}
	modes, ok := modesByKind[c.Kind]
	if !ok {
		return delivery.Route{}, fmt.Errorf("kind %q: want http, webhook, webpush or smtp", c.Kind)
	}
	mode, err := l.mode(c, modes)
	if err != nil {
		return delivery.Route{}, err
	}
	contract, err := l.contract(c, mode)
	if err != nil {
		return delivery.Route{}, err
	}
	limit, err := rateLimit(c)
	if err != nil {
		return delivery.Route{}, err
	}
	client, err := l.client(c)
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

func (l loader) mode(c channel, modes []delivery.Mode) (delivery.Mode, error) {
	if c.Mode == "" {
		if c.Kind == KindHTTP {
			return "", errors.New("mode: required for kind http (idempotent, queryable or none: what the endpoint promises)")
		}
		return modes[0], nil
	}
	m, err := delivery.ParseMode(c.Mode)
	if err != nil {
		return "", fmt.Errorf("mode %q: want idempotent, queryable or none", c.Mode)
	}
	if !slices.Contains(modes, m) {
		return "", fmt.Errorf("mode %q: kind %s %s", c.Mode, c.Kind, offers(c.Kind))
	}
	return m, nil
}

func offers(kind string) string {
	switch kind {
	case KindWebhook:
		return "offers no query (Standard Webhooks are idempotent by webhook-id): want idempotent or none"
	case KindWebPush:
		return "offers neither idempotency keys nor queries: want none (see resend_with_topic)"
	case KindSMTP:
		return "offers neither idempotency keys nor queries: want none"
	}
	return ""
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
	k.ResendWithTopic = c.ResendWithTopic
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

func (l loader) client(c channel) (delivery.Channel, error) {
	caFile := l.path(c.CAFile)
	switch c.Kind {
	case KindHTTP:
		if c.URL == "" {
			return nil, errors.New("url: required for kind http")
		}
		client, err := httpchannel.New(c.URL, httpchannel.Options{CAFile: caFile})
		return client, keyErr("url", err)
	case KindWebhook:
		secret, err := l.secret("secret", c.SecretEnv, c.SecretFile)
		if err != nil {
			return nil, err
		}
		client, err := webhook.New(secret, webhook.Options{CAFile: caFile})
		return client, keyErr("secret", err)
	case KindWebPush:
		pem, err := l.secret("vapid_private_key", c.VAPIDPrivateKeyEnv, c.VAPIDPrivateKeyFile)
		if err != nil {
			return nil, err
		}
		key, err := webpush.ParseVAPIDKey([]byte(pem))
		if err != nil {
			return nil, keyErr("vapid_private_key", err)
		}
		if c.VAPIDSubject == "" {
			return nil, errors.New("vapid_subject: required (mailto:address or an https URL the push service can use to reach you)")
		}
		client, err := webpush.New(webpush.Options{VAPIDKey: key, Subject: c.VAPIDSubject, Urgency: webpush.Urgency(c.Urgency), CAFile: caFile})
		return client, keyErr("webpush", err)
	case KindSMTP:
		if c.Addr == "" || c.From == "" {
			return nil, errors.New("addr and from: required for kind smtp")
		}
		var password string
		if c.Username != "" || c.PasswordEnv != "" || c.PasswordFile != "" {
			if c.Username == "" {
				return nil, errors.New("username: required with password_env/password_file")
			}
			var err error
			if password, err = l.secret("password", c.PasswordEnv, c.PasswordFile); err != nil {
				return nil, err
			}
		}
		mode, err := smtpchannel.ParseTLSMode(c.StartTLS)
		if err != nil {
			return nil, keyErr("", err)
		}
		client, err := smtpchannel.New(smtpchannel.Options{Addr: c.Addr, StartTLS: mode, CAFile: caFile,
			Username: c.Username, Password: password, From: c.From, HeloName: c.HeloName,
			MessageIDDomain: c.MessageIDDomain, SubjectPrefix: c.SubjectPrefix})
		return client, keyErr("smtp", err)
	}
	return nil, fmt.Errorf("kind %q", c.Kind)
}

// secret reads a secret from exactly one of NAME_env and NAME_file. Errors name the variable or
// file, never the value.
func (l loader) secret(name, env, file string) (string, error) {
	switch {
	case env != "" && file != "":
		return "", fmt.Errorf("%s_env and %s_file: give one, not both", name, name)
	case env != "":
		v := l.getenv(env)
		if strings.TrimSpace(v) == "" {
			return "", fmt.Errorf("%s_env: environment variable %s is unset or empty", name, env)
		}
		return strings.TrimRight(v, "\r\n"), nil
	case file != "":
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

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
