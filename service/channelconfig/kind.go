package channelconfig

import (
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/notifierhq/notifier/service/delivery"
)

// kind is one kind of channel (kind = "..." in a table): the modes its protocol supports, the keys it
// reads, and how it builds its client. Each kind registers itself from its own file (http.go,
// webhook.go, ...), so adding a provider touches no other kind.
type kind struct {
	name string
	// modes the kind's protocol supports, the default first. Claiming less than the protocol offers is
	// allowed (a webhook may be run as NONE); claiming more is refused at load.
	modes []delivery.Mode
	// modeRequired: no default, the table must say (a generic endpoint decides what it promises).
	modeRequired bool
	// offers says, in an error, what the kind's protocol offers (after "kind NAME ").
	offers string
	// contractKeys lists which of the contract keys (idempotency_window, query_settle,
	// resend_with_topic, resend_with_collapse) the kind accepts.
	contractKeys []string
	// defaults is the contract the provider documents: an idempotency_window (mode idempotent), or a
	// query_settle or max_in_flight_age (mode queryable), the table leaves unset takes its value; a
	// longer idempotency_window or max_in_flight_age is refused (the provider forgets keys, or drops
	// messages from its search, sooner); and ServerErrorsUncertain cannot be turned off (the provider
	// does not promise that a 5xx or 429 comes before it accepted); ThrottleRefuses is the kind's alone
	// (its provider documents a 429 as not processed: a retry after Retry-After, never uncertain).
	defaults delivery.Contract
	// keys the kind's own part reads (from its config struct's toml tags).
	keys []string
	// decode reads the kind's own part of a table and returns the builder of its client, and what
	// finishes the route's contract from the kind's own keys (nil when the kind has no such keys).
	decode func(md toml.MetaData, p toml.Primitive) (func(loader) (delivery.Channel, error), contractFinisher, error)
}

// contractFinisher completes a route's contract, after the defaults, from a kind's own keys (Postmark's
// retention bounds max_in_flight_age). Its errors name the keys.
type contractFinisher func(mode delivery.Mode, k delivery.Contract) (delivery.Contract, error)

var kinds = map[string]kind{}

// register adds a kind whose own keys are the toml tags of C; build makes its client from them, and
// finish, when given, completes the route's contract from them.
func register[C any](k kind, build func(l loader, c *C) (delivery.Channel, error),
	finish ...func(c *C, mode delivery.Mode, k delivery.Contract) (delivery.Contract, error)) {
	if _, dup := kinds[k.name]; dup {
		panic("channelconfig: kind " + k.name + " registered twice")
	}
	if len(k.modes) == 0 {
		panic("channelconfig: kind " + k.name + " supports no mode")
	}
	k.keys = tomlKeys(reflect.TypeFor[C]())
	for _, key := range k.keys {
		if slices.Contains(common, key) || slices.Contains(contractKeys, key) {
			panic("channelconfig: kind " + k.name + " redefines the common key " + key)
		}
	}
	k.decode = func(md toml.MetaData, p toml.Primitive) (func(loader) (delivery.Channel, error), contractFinisher, error) {
		c := new(C)
		if err := md.PrimitiveDecode(p, c); err != nil {
			return nil, nil, err
		}
		var finisher contractFinisher
		if len(finish) > 0 {
			finisher = func(mode delivery.Mode, k delivery.Contract) (delivery.Contract, error) { return finish[0](c, mode, k) }
		}
		return func(l loader) (delivery.Channel, error) { return build(l, c) }, finisher, nil
	}
	kinds[k.name] = k
}

func tomlKeys(t reflect.Type) []string {
	var keys []string
	for i := range t.NumField() {
		tag, _, _ := strings.Cut(t.Field(i).Tag.Get("toml"), ",")
		if tag == "" || tag == "-" {
			panic(fmt.Sprintf("channelconfig: %s.%s has no toml key", t.Name(), t.Field(i).Name))
		}
		keys = append(keys, tag)
	}
	return keys
}

// kindList names the registered kinds for an error: "apns, fcm, http or smtp".
func kindList() string {
	names := make([]string, 0, len(kinds))
	for name := range kinds {
		names = append(names, name)
	}
	sort.Strings(names)
	if len(names) == 1 {
		return names[0]
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// kindsWithKey names the kinds that read key, for the error of a table of another kind that sets it.
func kindsWithKey(key string) string {
	var owners []string
	for name, k := range kinds {
		if slices.Contains(k.keys, key) || slices.Contains(k.contractKeys, key) {
			owners = append(owners, name)
		}
	}
	sort.Strings(owners)
	return strings.Join(owners, ", ")
}

// Kinds returns the registered kinds' names, sorted.
func Kinds() []string {
	names := make([]string, 0, len(kinds))
	for name := range kinds {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}
