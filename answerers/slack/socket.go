package slack

import (
	"context"
	"fmt"
	"sync"
	"time"

	slackapi "github.com/slack-go/slack"
	"github.com/slack-go/slack/socketmode"
)

// socketMode receives interactions over Socket Mode (Config.AppToken)
// until ctx ends, reconnecting with backoff when the connection cannot be
// kept. The WebSocket is opened with the app-level token over TLS, so
// these interactions carry no request signature to check; they are
// handled exactly as the HTTP ones and acknowledged with the same reply.
func (s *Server) socketMode(ctx context.Context) {
	api := slackapi.New(s.cfg.BotToken, slackapi.OptionAPIURL(s.cfg.APIURL), slackapi.OptionAppLevelToken(s.cfg.AppToken),
		slackapi.OptionHTTPClient(&bearerClient{c: s.httpClient, token: s.cfg.BotToken}))
	backoff := time.Second
	for ctx.Err() == nil {
		smc := socketmode.New(api)
		cctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Go(func() { s.socketEvents(cctx, smc) })
		started := time.Now()
		err := smc.RunContext(cctx)
		cancel()
		wg.Wait()
		if ctx.Err() != nil {
			return
		}
		if time.Since(started) > time.Minute {
			backoff = time.Second
		}
		s.log.Warn("socket mode connection lost; reconnecting", "err", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Minute)
	}
}

// socketEvents handles the events of one Socket Mode client until ctx
// ends.
func (s *Server) socketEvents(ctx context.Context, smc *socketmode.Client) {
	for {
		select {
		case <-ctx.Done():
			return
		case evt, ok := <-smc.Events:
			if !ok {
				return
			}
			switch evt.Type {
			case socketmode.EventTypeInteractive:
				cb, ok := evt.Data.(slackapi.InteractionCallback)
				if !ok || evt.Request == nil {
					continue
				}
				reply := s.interact(s.workCtx, &cb)
				if err := smc.AckCtx(ctx, evt.Request.EnvelopeID, reply); err != nil {
					s.log.Warn("socket mode acknowledgement not sent", "err", err)
				}
			case socketmode.EventTypeConnected:
				s.log.Info("socket mode connected")
			case socketmode.EventTypeInvalidAuth, socketmode.EventTypeConnectionError, socketmode.EventTypeIncomingError:
				s.log.Warn("socket mode trouble", "event", string(evt.Type), "detail", fmt.Sprint(evt.Data))
			case socketmode.EventTypeEventsAPI, socketmode.EventTypeSlashCommand:
				if evt.Request != nil {
					_ = smc.AckCtx(ctx, evt.Request.EnvelopeID, nil) // not ours: acknowledged, ignored
				}
			}
		}
	}
}
