// Package config loads rtcedge's YAML config files: strictly (an unknown or
// misspelt key is an error) and with ${VAR} expansion from the environment
// that fails on an unset variable, naming it. Every role loads its file
// with Load; defaults and validation live with the package that uses them.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// ErrUnsetVariable is returned (wrapped, naming the variables) when a
// config file refers to an environment variable that is not set.
var ErrUnsetVariable = errors.New("config: environment variable not set")

var envRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// Expand replaces every ${VAR} in s with the variable's value from lookup
// (nil: the process environment), so that a Kubernetes pod can advertise
// "${POD_IP}:7000" from the downward API. Only the braced form is
// expanded: a bare "$" stays as written. A variable that is not set at all
// is an error naming it (set but empty is allowed): a typo must not
// silently become an empty address.
func Expand(s string, lookup func(string) (string, bool)) (string, error) {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	var unset []string
	out := envRef.ReplaceAllStringFunc(s, func(m string) string {
		name := m[2 : len(m)-1]
		v, ok := lookup(name)
		if !ok {
			if !slices.Contains(unset, name) {
				unset = append(unset, name)
			}
			return m
		}
		return v
	})
	if len(unset) > 0 {
		return "", fmt.Errorf("%w: %s", ErrUnsetVariable, strings.Join(unset, ", "))
	}
	return out, nil
}

// Decode parses YAML data, expands ${VAR} in its values (not in keys or
// comments; see Expand) and decodes it strictly into v: an unknown key is
// an error. An empty document leaves v unchanged.
func Decode(data []byte, v any) error {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return err
	}
	if doc.Kind == 0 {
		return nil // empty
	}
	if err := expandNode(&doc); err != nil {
		return err
	}
	expanded, err := yaml.Marshal(&doc)
	if err != nil {
		return err
	}
	dec := yaml.NewDecoder(bytes.NewReader(expanded))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

// expandNode expands the scalar values under n, naming the line of the
// first one that refers to an unset variable.
func expandNode(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		v, err := Expand(n.Value, nil)
		if err != nil {
			return fmt.Errorf("line %d: %w", n.Line, err)
		}
		n.Value = v
		return nil
	}
	for i, c := range n.Content {
		if n.Kind == yaml.MappingNode && i%2 == 0 {
			continue // a key
		}
		if err := expandNode(c); err != nil {
			return err
		}
	}
	return nil
}

// Load reads the YAML file at path into v (see Decode). When v has an
// ApplyEnv() error method it is called afterwards, so a role's secrets
// from the environment override the file.
func Load(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read config: %w", err)
	}
	if err := Decode(data, v); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	if e, ok := v.(interface{ ApplyEnv() error }); ok {
		if err := e.ApplyEnv(); err != nil {
			return fmt.Errorf("config %s: %w", path, err)
		}
	}
	return nil
}

// Default sets *p to v when *p is its type's zero value (unset): a
// Defaults method's one line per field.
func Default[T comparable](p *T, v T) {
	var zero T
	if *p == zero {
		*p = v
	}
}
