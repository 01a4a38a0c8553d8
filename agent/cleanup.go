package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgeproxy/edgeproxy/agent/config"
	"github.com/edgeproxy/edgeproxy/datapath/iptables"
)

// Cleanup removes every kernel object any edgeproxy mode created, whatever
// mode cfg names: switching modes or uninstalling must leave nothing behind.
func Cleanup(ctx context.Context, cfg *config.Config, log *slog.Logger) error {
	var errs []error
	ipt, err := iptables.New(iptablesOptions(cfg, log, prometheus.NewRegistry()))
	if err != nil {
		errs = append(errs, fmt.Errorf("iptables: %w", err))
	} else if err := ipt.Cleanup(ctx); err != nil {
		errs = append(errs, fmt.Errorf("iptables: %w", err))
	} else {
		log.Info("removed edgeproxy's iptables chains and rules")
	}
	return errors.Join(errs...)
}
