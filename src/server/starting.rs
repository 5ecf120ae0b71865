//! The server, started before the models load: it answers 503 until `serve` hands it the loaded state, and stops on
//! SIGTERM or SIGINT after letting running requests finish.

use std::io;
use std::net::{TcpListener, ToSocketAddrs};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use actix_web::dev::ServerHandle;
use actix_web::rt::signal::unix::{signal, Signal, SignalKind};
use actix_web::{web, HttpServer};
use tensorfold_actors::runtime::Runtime;
use tokio::sync::oneshot;

use super::body::BodyTimeout;
use super::routes::{app_over, Slot};
use super::{AppState, ServeConfig};

/// How long a stopping server waits, past the drain, for replies that are still being written.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// The running HTTP server, on its own thread, and the slot its handlers wait on.
pub struct Starting {
    slot: Slot<tensorfold_actors::runtime::Runtime>,
    stopped: oneshot::Receiver<io::Result<()>>,
    thread: JoinHandle<()>,
}

impl Starting {
    /// Binds every address the host resolves to, prints `listening on http://ADDR` for each, and starts serving.
    pub fn bind(config: &ServeConfig) -> io::Result<Starting> {
        let mut listeners = Vec::new();
        for addr in (config.host.as_str(), config.port).to_socket_addrs()? {
            listeners.push(TcpListener::bind(addr)?);
        }
        let bound = listeners.iter().map(TcpListener::local_addr).collect::<io::Result<Vec<_>>>()?;
        if listeners.is_empty() {
            let why = format!("{} resolves to no address", config.host);
            return Err(io::Error::new(io::ErrorKind::AddrNotAvailable, why));
        }
        let slot = Slot::default();
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (stopped_tx, stopped) = oneshot::channel();
        let (app_slot, api_key, max_body_bytes) = (slot.clone(), config.api_key.clone(), config.max_body_bytes);
        let (signal_slot, drain) = (slot.clone(), config.drain);
        let (header_timeout, body_timeout, keep_alive) =
            (config.header_timeout, config.body_timeout, config.keep_alive);
        let thread = std::thread::Builder::new().name("tf-http".into()).spawn(move || {
            actix_web::rt::System::new().block_on(async move {
                // Listening before the address is printed, so a signal from then on is never missed.
                let signals = match Signals::listen() {
                    Ok(signals) => signals,
                    Err(e) => return drop(started_tx.send(Err(e))),
                };
                let app = move || {
                    let app = app_over(app_slot.clone(), api_key.clone(), max_body_bytes);
                    app.app_data(web::Data::new(BodyTimeout(body_timeout)))
                };
                let server = HttpServer::new(app)
                    .keep_alive(keep_alive)
                    .client_request_timeout(header_timeout)
                    .disable_signals()
                    .shutdown_timeout((drain + STOP_GRACE).as_secs());
                let server = listeners.into_iter().try_fold(server, HttpServer::listen);
                let server = match server {
                    Ok(server) => server.run(),
                    Err(e) => return drop(started_tx.send(Err(e))),
                };
                actix_web::rt::spawn(stop_on_signal(signals, server.handle(), signal_slot, drain));
                let _ = started_tx.send(Ok(()));
                let _ = stopped_tx.send(server.await);
            })
        })?;
        started_rx.recv().unwrap_or_else(|_| Err(io::Error::other("the HTTP server's thread ended")))?;
        for addr in bound {
            eprintln!("listening on http://{addr}");
        }
        Ok(Starting { slot, stopped, thread })
    }

    /// Hands the loaded state to the handlers, so `/health` turns 200, and serves until the server stops.
    pub async fn serve(self, state: AppState) -> io::Result<()> {
        if self.slot.set(actix_web::web::Data::new(state)).is_err() {
            return Err(io::Error::other("the server was handed its state twice"));
        }
        tracing::info!("every model is loaded; serving");
        let result = self.stopped.await.unwrap_or_else(|_| Err(io::Error::other("the HTTP server's thread ended")));
        let _ = self.thread.join();
        result
    }
}

/// On SIGTERM or SIGINT: exits at once while the models load; once serving, stops accepting connections, gives the
/// running requests `drain` to finish, ends the rest with an error, and lets the server stop.
async fn stop_on_signal(mut signals: Signals, handle: ServerHandle, slot: Slot<Runtime>, drain: Duration) {
    let signal = signals.first().await;
    let Some(state) = slot.get().cloned() else {
        eprintln!("{signal} while the models load: exiting");
        std::process::exit(0);
    };
    tracing::info!(
        signal,
        drain_seconds = drain.as_secs(),
        "stopping: no new connections; running requests may finish"
    );
    let stopped = handle.stop(true);
    let deadline = Instant::now() + drain;
    while state.runtime.is_busy() && Instant::now() < deadline {
        actix_web::rt::time::sleep(Duration::from_millis(20)).await;
    }
    state.runtime.close().await;
    stopped.await;
}

/// SIGTERM and SIGINT, caught from the moment they are listened for.
struct Signals {
    term: Signal,
    interrupt: Signal,
}

impl Signals {
    fn listen() -> io::Result<Signals> {
        Ok(Signals { term: signal(SignalKind::terminate())?, interrupt: signal(SignalKind::interrupt())? })
    }

    /// The name of the first to arrive.
    async fn first(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.interrupt.recv() => "SIGINT",
        }
    }
}
