package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/rtcedge/rtcedge/internal/authority"
	"github.com/rtcedge/rtcedge/internal/node"
	"github.com/rtcedge/rtcedge/transceiver"
)

func init() {
	commands = append(commands, command{"keys", "issue deployment authority keys: root, cluster, pop, signaling, public, pod (docs/operations.md)", runKeys})
}

// envAuthorityRoot holds the deployment's root secret for "keys cluster";
// only the operator (or Terraform) has it.
const envAuthorityRoot = "RTCEDGE_AUTHORITY_ROOT"

// runKeys issues the deployment authority's keys:
//
//	rtcedge keys root                         a fresh root secret (base64)
//	rtcedge keys cluster -cluster N [-id ID]  cluster N's secret spec from $RTCEDGE_AUTHORITY_ROOT
//	rtcedge keys pop -pop N [-id ID]          POP N's secret spec (its global relays), likewise
//	rtcedge keys signaling [-id ID]           the signaling replicas' secret spec, likewise
//	rtcedge keys public                       the public keys of the secrets in $RTCEDGE_AUTHORITY_KEYS
//	                                          (for signaling: every cluster's and POP's; cluster relays: signaling's)
//	rtcedge keys pod -cluster N [-pod P] -out FILE
//	                                          a pod's keys from $RTCEDGE_AUTHORITY_KEYS;
//	                                          P defaults to the hostname's ordinal + 1
//
// "keys pod" is what a transceiver's init container runs: it holds the
// cluster secret, the pod's main container only the file it writes.
func runKeys(_ context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("want root, cluster, pop, signaling, public or pod")
	}
	fs := flag.NewFlagSet("keys "+args[0], flag.ContinueOnError)
	cluster := fs.Uint("cluster", 0, "cluster ID")
	pop := fs.Uint("pop", 0, "POP ID")
	id := fs.Uint("id", 1, "key ID (0..15) of the secret")
	pod := fs.Uint("pod", 0, "pod ID; default: from the hostname's -N ordinal")
	out := fs.String("out", "", "file to write the pod's keys to")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	switch args[0] {
	case "root":
		b := make([]byte, authority.KeyLen)
		if _, err := rand.Read(b); err != nil {
			return err
		}
		fmt.Println(base64.StdEncoding.EncodeToString(b))
		return nil
	case "cluster", "pop", "signaling":
		root, err := base64.StdEncoding.DecodeString(strings.TrimSpace(os.Getenv(envAuthorityRoot)))
		if err != nil || len(root) != authority.KeyLen {
			return fmt.Errorf("$%s: want the base64 of %d bytes (rtcedge keys root)", envAuthorityRoot, authority.KeyLen)
		}
		if *id > authority.MaxKeyID {
			return errors.New("want -id 0..15")
		}
		switch {
		case args[0] == "signaling":
			fmt.Println(authority.SignalingSpec(uint8(*id), authority.SignalingSecret(root)))
		case args[0] == "pop" && *pop > 0 && *pop <= 65535:
			fmt.Println(authority.POPSpec(uint16(*pop), uint8(*id), authority.POPSecret(root, uint16(*pop))))
		case args[0] == "cluster" && *cluster > 0 && *cluster <= 65535:
			fmt.Println(authority.Spec(uint16(*cluster), uint8(*id), authority.ClusterSecret(root, uint16(*cluster))))
		default:
			return fmt.Errorf("want -%s 1..65535", args[0])
		}
		return nil
	case "public":
		var a node.Authority
		a.ApplyEnv()
		sec, err := a.Secrets()
		if err != nil || sec == nil {
			return fmt.Errorf("$%s: %v", node.EnvAuthorityKeys, err)
		}
		fmt.Println(strings.Join(sec.PublicSpecs(), ","))
		return nil
	case "pod":
		var a node.Authority
		a.ApplyEnv()
		sec, err := a.Secrets()
		if err != nil || sec == nil {
			return fmt.Errorf("$%s: %v", node.EnvAuthorityKeys, err)
		}
		p := uint16(*pod)
		if p == 0 {
			h, err := os.Hostname()
			if err != nil {
				return err
			}
			if p, err = transceiver.PodFromHostname(h); err != nil {
				return err
			}
		}
		if *out == "" || *cluster == 0 || *cluster > 65535 {
			return errors.New("want -cluster 1..65535 and -out FILE")
		}
		k, err := sec.Pod(uint16(*cluster), p)
		if err != nil {
			return err
		}
		return k.WriteFile(*out)
	}
	return fmt.Errorf("unknown keys command %q: want root, cluster, pop, signaling, public or pod", args[0])
}
