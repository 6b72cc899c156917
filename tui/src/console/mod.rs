//! `apollo-tui`: the console. Keys → [`app::Action`] → [`app::App::update`];
//! agent news → [`app::App::on_news`]; views draw `&App`. The agent worker
//! owns the connection; the UI never waits on the network.
//!
//! Layout:
//! - `app`: state (`mod.rs`), its vocabulary (`types.rs`), keys in (`update.rs`), news in (`news.rs`).
//! - `keys`: the one keymap.
//! - `worker`: the connection (socket or SSH), subscription, refreshes, actions.
//! - `ui`: drawing; `json`: folding JSON trees.

pub mod app;
pub mod json;
pub mod keys;
pub mod ui;
pub mod worker;

use app::{Action, App, Cmd};
use crossterm::event::{Event as TermEvent, EventStream, KeyEventKind};
use crossterm::terminal::{disable_raw_mode, enable_raw_mode, EnterAlternateScreen, LeaveAlternateScreen};
use futures::StreamExt;
use ratatui::backend::CrosstermBackend;
use ratatui::Terminal;
use tokio::sync::mpsc;

/// Restores the terminal when dropped: on return, on error, and (through
/// the panic hook) on panic.
struct TerminalGuard;

fn restore() {
    let _ = disable_raw_mode();
    let _ = crossterm::execute!(std::io::stdout(), LeaveAlternateScreen, crossterm::cursor::Show);
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore();
    }
}

/// Runs the console against `target` until the user quits or SIGTERM.
pub async fn run(
    target: crate::client::Target,
    readonly: bool,
    context: Option<crate::contexts::Context>,
) -> anyhow::Result<()> {
    let theme = ui::Theme { color: std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()) };
    let mut app = App::new(target.describe(), readonly);
    app.context = context;
    match crate::contexts::Contexts::load() {
        Ok(c) => app.contexts = c.contexts,
        Err(e) => app.say(e, true),
    }
    // One worker per attached agent; a context switch starts a new one
    // with its own news channel, so nothing of the old one is shown.
    let spawn = |target: crate::client::Target| {
        let (cmd_tx, cmd_rx) = mpsc::channel::<Cmd>(64);
        let (news_tx, news_rx) = mpsc::channel(1024);
        (cmd_tx, news_rx, tokio::spawn(worker::run(target, cmd_rx, news_tx)))
    };
    let (mut cmd_tx, mut news_rx, mut worker) = spawn(target);
    let (fleet_tx, mut fleet_rx) = mpsc::channel(256);
    let mut fleet: Option<tokio::task::JoinHandle<()>> = None;

    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        restore();
        hook(info);
    }));
    enable_raw_mode()?;
    let _guard = TerminalGuard;
    crossterm::execute!(std::io::stdout(), EnterAlternateScreen)?;
    let mut terminal = Terminal::new(CrosstermBackend::new(std::io::stdout()))?;
    let mut keys = EventStream::new();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    // Redraw on input, on news, and once a second for the header's clock.
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        terminal.draw(|f| ui::draw(f, &app, &theme))?;
        let cmds = tokio::select! {
            ev = keys.next() => match ev {
                Some(Ok(TermEvent::Key(k))) if k.kind != KeyEventKind::Release => match keys::action(&app.mode, k) {
                    Some(a) => app.update(a),
                    None => Vec::new(),
                },
                Some(Ok(_)) => Vec::new(),
                Some(Err(_)) | None => app.update(Action::Quit),
            },
            n = news_rx.recv() => match n {
                Some(n) => {
                    let mut cmds = app.on_news(n);
                    // Take whatever else arrived, then draw once.
                    while let Ok(n) = news_rx.try_recv() {
                        cmds.extend(app.on_news(n));
                    }
                    cmds
                }
                None => app.update(Action::Quit),
            },
            Some(n) = fleet_rx.recv() => {
                let mut cmds = app.on_news(n);
                while let Ok(n) = fleet_rx.try_recv() {
                    cmds.extend(app.on_news(n));
                }
                cmds
            },
            _ = tick.tick() => Vec::new(),
            _ = term.recv() => app.update(Action::Quit),
        };
        for c in cmds {
            match c {
                Cmd::Switch(ctx) => {
                    let target = crate::client::Target::of(&ctx);
                    app = app.for_context(ctx, target.describe());
                    let _ = cmd_tx.send(Cmd::Quit).await;
                    worker.abort();
                    (cmd_tx, news_rx, worker) = spawn(target);
                }
                Cmd::WatchFleet => {
                    if fleet.is_none() {
                        fleet = Some(tokio::spawn(worker::fleet(app.contexts.clone(), fleet_tx.clone())));
                    }
                }
                other => {
                    let _ = cmd_tx.send(other).await;
                }
            }
        }
        if app.quit {
            break;
        }
    }
    if let Some(f) = fleet {
        f.abort();
    }
    drop(cmd_tx);
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), worker).await;
    Ok(())
}
