//! The console's colours and emphasis; none when NO_COLOR is set.

use apollo_shared::state::Tone;
use ratatui::style::{Color, Modifier, Style};

/// Colours are dropped when NO_COLOR is set.
pub struct Theme {
    pub color: bool,
}

impl Theme {
    pub fn tone(&self, tone: Tone) -> Style {
        if !self.color {
            return Style::default();
        }
        let c = match tone {
            Tone::Good => Color::Green,
            Tone::Bad => Color::Red,
            Tone::Busy => Color::Cyan,
            Tone::Waiting => Color::Yellow,
            Tone::Undone => Color::Magenta,
            Tone::Quiet => Color::DarkGray,
            Tone::Plain => Color::Reset,
        };
        Style::default().fg(c)
    }
    pub fn selected(&self) -> Style {
        if self.color {
            Style::default().add_modifier(Modifier::REVERSED)
        } else {
            Style::default().add_modifier(Modifier::REVERSED | Modifier::BOLD)
        }
    }
    pub fn dim(&self) -> Style {
        if self.color {
            Style::default().fg(Color::DarkGray)
        } else {
            Style::default()
        }
    }
    pub fn error(&self) -> Style {
        if self.color {
            Style::default().fg(Color::Red)
        } else {
            Style::default().add_modifier(Modifier::BOLD)
        }
    }
}
