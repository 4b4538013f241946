package fastpath

// The kernel programs are C (bpf/fastpath.c), compiled by bpf2go into the
// committed fastpath_bpfel.go and fastpath_bpfel.o, so building rtcedge
// needs no clang. `make bpf` runs this line and records the sources' hash
// in bpf/sources.sha256; `make lint` fails when the two disagree.
//go:generate sh -c "go run github.com/cilium/ebpf/cmd/bpf2go -go-package fastpath -cc clang -no-strip -cflags \"-O2 -g -Wall -Werror -I/usr/include/$(uname -m)-linux-gnu\" -target bpfel -type gr_flow -type gr_flow_key -type gr_worker -type fp_addr4 -type fp_key -type fp_key_id -type cr_config -type fp_count fastpath bpf/fastpath.c && cd bpf && sha256sum fastpath.c fastpath.h > sources.sha256"
