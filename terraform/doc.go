// Package terraform holds rtcedge's Terraform modules and examples (HCL for
// the Cloudflare v5 and Kubernetes providers): cloudflare-steering, region,
// pop, workload (one role's pods, which region and pop call per role), and
// examples/two-regions. There is no Go code here; the package exists so that
// `go test ./terraform` parses every .tf file and checks, without Terraform,
// that variables, locals, module arguments, module outputs and moved blocks'
// addresses referenced anywhere are declared, and that the modules keep what
// the Cloudflare API and the deployment need: region codes from the
// documented enumeration, pools with check_regions, the visitor location
// managed transform, country pools from the catalogue's steering, relay
// records from plan-time addresses, Cloudflare's ranges from the data source,
// a NetworkPolicy for every container port, and make image's tag scheme. The
// checks of the pods evaluate the workload module for every role's call.
// names_test.go evaluates the variable validations and the names the modules
// compose (every accepted input must give names the Kubernetes API server
// takes) and which roles' pods a change of each Secret key rolls. `make
// test-k8s` applies the modules to a real kube-apiserver (scripts/k8s).
// See docs/deploy.md.
package terraform
