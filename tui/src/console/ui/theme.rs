//! The console's colours and emphasis; none when NO_COLOR is set.

use ratatui::style::{Color, Modifier, Style};

/// Colours are dropped when NO_COLOR is set.
pub struct Theme {
    pub color: bool,
}

impl Theme {
    pub fn state(&self, s: &str) -> Style {
        if !self.color {
            return Style::default();
        }
        let c = match s {
            "SUCCESS" => Color::Green,
            "FAILED" => Color::Red,
            "RUNNING" => Color::Cyan,
            "RETRYING" => Color::Yellow,
            "ROLLED_BACK" => Color::Magenta,
            "PENDING" | "SKIPPED" => Color::DarkGray,
            _ => Color::Reset,
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
