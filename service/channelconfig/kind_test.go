package channelconfig

import (
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/notifierhq/notifier/service/delivery"
)

type badTagConfig struct {
	URL string `toml:"url"`
	Raw string // no toml tag: a key nobody could set
}

type commonKeyConfig struct {
	Mode string `toml:"mode"` // a common key, which the common part reads
}

type contractKeyConfig struct {
	Window string `toml:"idempotency_window,omitempty"` // a contract key
}

// A kind is refused at registration, when the program starts, for each mistake a new kind's file
// could make; each panic names the kind and what is wrong.
func TestRegisterRefusesAMalformedKind(t *testing.T) {
	build := func(loader, *struct{}) (delivery.Channel, error) { return nil, nil }
	none := []delivery.Mode{delivery.ModeNone}
	for _, c := range []struct {
		name     string
		register func()
		panic    string
	}{
		{"twice", func() { register(kind{name: KindHTTP, modes: none}, build) }, "channelconfig: kind http registered twice"},
		{"no mode", func() { register(kind{name: "test-nomode"}, build) }, "channelconfig: kind test-nomode supports no mode"},
		{"a field without a key", func() {
			register(kind{name: "test-untagged", modes: none}, func(loader, *badTagConfig) (delivery.Channel, error) { return nil, nil })
		}, "channelconfig: badTagConfig.Raw has no toml key"},
		{"a common key", func() {
			register(kind{name: "test-common", modes: none}, func(loader, *commonKeyConfig) (delivery.Channel, error) { return nil, nil })
		}, "channelconfig: kind test-common redefines the common key mode"},
		{"a contract key", func() {
			register(kind{name: "test-contract", modes: none}, func(loader, *contractKeyConfig) (delivery.Channel, error) { return nil, nil })
		}, "channelconfig: kind test-contract redefines the common key idempotency_window"},
	} {
		t.Run(c.name, func(t *testing.T) {
			is := is.New(t)
			defer func() {
				r := recover()
				is.Equal(r, c.panic)
			}()
			c.register()
		})
	}
	for name := range kinds {
		if strings.HasPrefix(name, "test-") {
			t.Errorf("kind %s registered although refused", name)
		}
	}
}

// kindList reads as a sentence for one kind, two, and more.
func TestKindList(t *testing.T) {
	is := is.New(t)
	saved := kinds
	defer func() { kinds = saved }()
	kinds = map[string]kind{"http": {}}
	is.Equal(kindList(), "http")
	kinds = map[string]kind{"smtp": {}, "http": {}}
	is.Equal(kindList(), "http or smtp")
	kinds = map[string]kind{"webpush": {}, "smtp": {}, "http": {}}
	is.Equal(kindList(), "http, smtp or webpush")
}
