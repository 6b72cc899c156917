//! `apollo-agent dial-stdio`: bridges stdin/stdout to the local socket, so a
//! client can reach the agent through `ssh host apollo-agent dial-stdio`
//! with no port opened beyond SSH. Exits when either side closes.

use std::path::Path;

pub async fn run(socket: &Path) -> anyhow::Result<()> {
    let stream = tokio::net::UnixStream::connect(socket).await.map_err(|e| {
        anyhow::anyhow!(
            "{}: cannot connect to the agent socket: {e} (is apollo-agent running on this host?)",
            socket.display()
        )
    })?;
    let (mut rd, mut wr) = stream.into_split();
    let mut stdin = tokio::io::stdin();
    let mut stdout = tokio::io::stdout();
    let up = async {
        let _ = tokio::io::copy(&mut stdin, &mut wr).await;
        let _ = tokio::io::AsyncWriteExt::shutdown(&mut wr).await;
    };
    let down = async {
        let _ = tokio::io::copy(&mut rd, &mut stdout).await;
    };
    // Whichever side closes first ends the bridge.
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
    Ok(())
}
